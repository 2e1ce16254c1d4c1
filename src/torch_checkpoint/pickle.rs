//! The part of Python's pickle machine that a `torch.save` state dict
//! uses (protocols 2 to 5), run without Python: it builds values and calls
//! nothing. Of the globals a pickle may name, only those a state dict
//! needs are known ([`Global`]); any other stops the reading with its
//! name, so a checkpoint that would run code when PyTorch loads it (a
//! whole module, an arbitrary object, `os.system`) is refused here.

use anyhow::{Result, bail};
use std::collections::HashMap;

/// Element types of PyTorch's storages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The dtype of `torch.{name}`, a storage type's name.
    fn of_storage(name: &str) -> Option<DType> {
        Some(match name {
            "FloatStorage" => DType::F32,
            "HalfStorage" => DType::F16,
            "BFloat16Storage" => DType::BF16,
            "DoubleStorage" => DType::F64,
            "LongStorage" => DType::I64,
            "IntStorage" => DType::I32,
            "ShortStorage" => DType::I16,
            "CharStorage" => DType::I8,
            "ByteStorage" => DType::U8,
            "BoolStorage" => DType::Bool,
            _ => return None,
        })
    }
}

/// The globals a state dict's pickle names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Global {
    /// `collections.OrderedDict`: read as a dict.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`.
    RebuildTensor,
    /// `torch._utils._rebuild_parameter(tensor, requires_grad, hooks)`.
    RebuildParameter,
    /// `torch.FloatStorage` and the like: a storage's element type.
    Storage(DType),
}

impl Global {
    fn of(module: &str, name: &str) -> Option<Global> {
        match (module, name) {
            ("collections", "OrderedDict") => Some(Global::OrderedDict),
            ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensor),
            ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
            ("torch", storage) => DType::of_storage(storage).map(Global::Storage),
            _ => None,
        }
    }
}

/// A storage named by a persistent id: its entry `data/{key}` in the
/// archive, its element type and its element count.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageRef {
    pub key: String,
    pub dtype: DType,
    pub len: u64,
}

/// A tensor as `_rebuild_tensor_v2` describes it: a strided view of a
/// storage, in elements.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub offset: u64,
    pub shape: Vec<usize>,
    pub stride: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Pairs in insertion order (an OrderedDict's, too).
    Dict(Vec<(Value, Value)>),
    Global(Global),
    Storage(StorageRef),
    Tensor(TensorRef),
}

impl Value {
    /// What kind of value this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
            Value::Global(_) => "a class",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
        }
    }
}

/// The machine's state: the stack, the marks and the memo.
struct Machine<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
}

/// The value a pickle builds. Errors say what stopped it, and at which byte.
pub fn load(bytes: &[u8]) -> Result<Value> {
    let mut m = Machine {
        bytes,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        let at = m.at;
        let op = m.take(1)?[0];
        match m.step(op) {
            Ok(true) => {}
            Ok(false) => return m.pop(),
            Err(e) => bail!("pickle byte {at} (opcode {op:#04x}): {e}"),
        }
    }
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let Some(out) = self
            .at
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.at..end))
        else {
            bail!("the pickle ends early, at byte {}", self.bytes.len());
        };
        self.at += n;
        Ok(out)
    }

    fn int<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("take gives N bytes"))
    }

    /// A length of `N` bytes, then that many bytes.
    fn counted<const N: usize>(&mut self) -> Result<&[u8]> {
        let mut len = [0u8; 8];
        len[..N].copy_from_slice(&self.int::<N>()?);
        let len = u64::from_le_bytes(len);
        self.take(usize::try_from(len).unwrap_or(usize::MAX))
    }

    fn text<const N: usize>(&mut self) -> Result<String> {
        Ok(String::from_utf8(self.counted::<N>()?.to_vec())?)
    }

    /// A newline-ended line of the pickle (GLOBAL's module and name).
    fn line(&mut self) -> Result<String> {
        let rest = &self.bytes[self.at..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            bail!("a line without its end");
        };
        self.at += end + 1;
        Ok(String::from_utf8(rest[..end].to_vec())?)
    }

    fn push(&mut self, v: Value) {
        self.stack.push(v);
    }

    fn pop(&mut self) -> Result<Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            bail!("the stack is empty");
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&mut self) -> Result<&mut Value> {
        match self.stack.last_mut() {
            Some(v) => Ok(v),
            None => bail!("the stack is empty"),
        }
    }

    /// The values above the last mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let Some(mark) = self.marks.pop() else {
            bail!("no mark to pop to");
        };
        Ok(self.stack.split_off(mark))
    }

    /// The memo keeps a copy: a dict or list filled after it was memoised
    /// reads back as it was then. Python shares the one object, but what
    /// torch.save writes refers back only to strings, storages, tensors
    /// and globals, which do not change.
    fn memo_put(&mut self, key: u32) -> Result<()> {
        let v = self.top()?.clone();
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<()> {
        let Some(v) = self.memo.get(&key) else {
            bail!("memo {key} was never stored");
        };
        let v = v.clone();
        self.push(v);
        Ok(())
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            bail!("an odd number of keys and values");
        }
        let Value::Dict(dict) = self.top()? else {
            bail!("items set on something not a dict");
        };
        let mut items = items.into_iter();
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            dict.push((k, v));
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<Value>) -> Result<()> {
        let Value::List(list) = self.top()? else {
            bail!("items appended to something not a list");
        };
        list.extend(items);
        Ok(())
    }

    fn global(&mut self, module: &str, name: &str) -> Result<()> {
        match Global::of(module, name) {
            Some(g) => {
                self.push(Value::Global(g));
                Ok(())
            }
            None => bail!(
                "the checkpoint names the Python object {module}.{name}, which a state dict \
                 of tensors does not need. captune reads tensors without running a \
                 checkpoint's code, so it refuses this file: save the weights alone \
                 (torch.save(model.state_dict(), PATH)) or as safetensors"
            ),
        }
    }

    /// One opcode; false at STOP.
    fn step(&mut self, op: u8) -> Result<bool> {
        match op {
            b'.' => return Ok(false),
            0x80 => {
                let protocol = self.take(1)?[0];
                if !(2..=5).contains(&protocol) {
                    bail!("pickle protocol {protocol}; torch.save writes 2 to 5");
                }
            }
            // FRAME: a length hint.
            0x95 => {
                self.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?.clone();
                self.push(v);
            }
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'K' => {
                let v = self.take(1)?[0];
                self.push(Value::Int(v.into()));
            }
            b'M' => {
                let v = u16::from_le_bytes(self.int()?);
                self.push(Value::Int(v.into()));
            }
            b'J' => {
                let v = i32::from_le_bytes(self.int()?);
                self.push(Value::Int(v.into()));
            }
            // LONG1: a little-endian two's-complement integer of n bytes.
            0x8a => {
                let n = self.take(1)?[0] as usize;
                if n > 8 {
                    bail!("an integer of {n} bytes, beyond 64 bits");
                }
                let bytes = self.take(n)?;
                let fill = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut full = [fill; 8];
                full[..n].copy_from_slice(bytes);
                self.push(Value::Int(i64::from_le_bytes(full)));
            }
            b'G' => {
                let v = f64::from_be_bytes(self.int()?);
                self.push(Value::Float(v));
            }
            b'X' => {
                let s = self.text::<4>()?;
                self.push(Value::Str(s));
            }
            0x8c => {
                let s = self.text::<1>()?;
                self.push(Value::Str(s));
            }
            0x8d => {
                let s = self.text::<8>()?;
                self.push(Value::Str(s));
            }
            // SHORT_BINSTRING and BINSTRING: protocol 2's byte strings.
            b'U' => {
                let s = String::from_utf8_lossy(self.counted::<1>()?).into_owned();
                self.push(Value::Str(s));
            }
            b'T' => {
                let s = String::from_utf8_lossy(self.counted::<4>()?).into_owned();
                self.push(Value::Str(s));
            }
            b'C' => {
                let b = self.counted::<1>()?.to_vec();
                self.push(Value::Bytes(b));
            }
            b'B' => {
                let b = self.counted::<4>()?.to_vec();
                self.push(Value::Bytes(b));
            }
            b')' => self.push(Value::Tuple(Vec::new())),
            b't' => {
                let items = self.pop_mark()?;
                self.push(Value::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    bail!("a tuple of {n} from a stack of fewer");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Value::Tuple(items));
            }
            b']' => self.push(Value::List(Vec::new())),
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Value::List(items));
            }
            b'a' => {
                let v = self.pop()?;
                self.append(vec![v])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.append(items)?;
            }
            b'}' => self.push(Value::Dict(Vec::new())),
            b'd' => {
                let items = self.pop_mark()?;
                self.push(Value::Dict(Vec::new()));
                self.set_items(items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            b'q' => {
                let key = self.take(1)?[0];
                self.memo_put(key.into())?;
            }
            b'r' => {
                let key = u32::from_le_bytes(self.int()?);
                self.memo_put(key)?;
            }
            0x94 => {
                let key = self.memo.len() as u32;
                self.memo_put(key)?;
            }
            b'h' => {
                let key = self.take(1)?[0];
                self.memo_get(key.into())?;
            }
            b'j' => {
                let key = u32::from_le_bytes(self.int()?);
                self.memo_get(key)?;
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.global(&module, &name)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(module), Value::Str(name)) = (module, name) else {
                    bail!("STACK_GLOBAL without a module and a name");
                };
                self.global(&module, &name)?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let storage = persistent_storage(pid)?;
                self.push(Value::Storage(storage));
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = call(callable, args)?;
                self.push(v);
            }
            // BUILD: an OrderedDict's state is its `_metadata` (module
            // versions), which tensors do not need.
            b'b' => {
                let _state = self.pop()?;
                if !matches!(self.top()?, Value::Dict(_) | Value::Tensor(_)) {
                    bail!(
                        "BUILD on {}, which a state dict does not hold",
                        self.top()?.kind()
                    );
                }
            }
            _ => bail!("an opcode a state dict's pickle does not use"),
        }
        Ok(true)
    }
}

/// The storage a persistent id `('storage', torch.XStorage, key,
/// location, numel)` names.
fn persistent_storage(pid: Value) -> Result<StorageRef> {
    let Value::Tuple(parts) = pid else {
        bail!("a persistent id that is {}, not a tuple", pid.kind());
    };
    match parts.as_slice() {
        [
            Value::Str(kind),
            Value::Global(Global::Storage(dtype)),
            Value::Str(key),
            Value::Str(_),
            Value::Int(len),
        ] if kind == "storage" && *len >= 0 => Ok(StorageRef {
            key: key.clone(),
            dtype: *dtype,
            len: *len as u64,
        }),
        _ => bail!("a persistent id that is not a storage's"),
    }
}

/// What REDUCE makes of a known global and its arguments.
fn call(callable: Value, args: Value) -> Result<Value> {
    let Value::Tuple(args) = args else {
        bail!("call arguments that are {}, not a tuple", args.kind());
    };
    let Value::Global(g) = callable else {
        bail!("a call of {}", callable.kind());
    };
    match (g, args.as_slice()) {
        (Global::OrderedDict, []) => Ok(Value::Dict(Vec::new())),
        (
            Global::RebuildTensor,
            [
                Value::Storage(s),
                Value::Int(offset),
                Value::Tuple(size),
                Value::Tuple(stride),
                ..,
            ],
        ) if *offset >= 0 && size.len() == stride.len() => {
            let dims = |t: &[Value]| -> Result<Vec<u64>> {
                t.iter()
                    .map(|v| match v {
                        Value::Int(n) if *n >= 0 => Ok(*n as u64),
                        _ => bail!("a tensor size or stride that is not a count"),
                    })
                    .collect()
            };
            let shape = dims(size)?
                .into_iter()
                .map(usize::try_from)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Tensor(TensorRef {
                storage: s.clone(),
                offset: *offset as u64,
                shape,
                stride: dims(stride)?,
            }))
        }
        (Global::RebuildParameter, [tensor @ Value::Tensor(_), ..]) => Ok(tensor.clone()),
        (g, _) => bail!("{g:?} called with arguments it does not take"),
    }
}
