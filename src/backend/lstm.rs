//! An LSTM cell's step: its gates' layout and the shapes of one step.

/// An LSTM cell's gates, as a row of its gates' pre-activations lays
/// them out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellGates {
    /// PyTorch's: input, forget, cell input (tanh), output.
    #[default]
    Lstm,
    /// Self-critical training's maxout cell (its FC and Att2in2 models):
    /// input, forget, output, then two candidates whose larger is the
    /// cell input, with no tanh.
    Maxout,
}

impl CellGates {
    /// Pre-activations per hidden unit.
    pub fn chunks(self) -> usize {
        match self {
            CellGates::Lstm => 4,
            CellGates::Maxout => 5,
        }
    }
}

/// One time step of an LSTM layer over `rows` sequences: the gates'
/// pre-activations `[rows, chunks * hidden]` start at `gates_offset`, rows
/// `gates_stride` apart; the cell and hidden states are read at `prev`
/// and written at `next`, rows `state_stride` apart in their tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LstmStep {
    pub cell: CellGates,
    pub rows: usize,
    pub hidden: usize,
    pub gates_offset: usize,
    pub gates_stride: usize,
    pub prev: usize,
    pub next: usize,
    pub state_stride: usize,
}

impl LstmStep {
    /// Step `t` of `rows` sequences of `steps` positions, gates
    /// `[rows, steps, chunks * hidden]` and states `[rows, steps + 1,
    /// hidden]` whose slot 0 is the initial state: step t reads slot t and
    /// writes slot t + 1.
    pub fn of_sequence(
        cell: CellGates,
        rows: usize,
        hidden: usize,
        steps: usize,
        t: usize,
    ) -> Self {
        let row = cell.chunks() * hidden;
        LstmStep {
            cell,
            rows,
            hidden,
            gates_offset: t * row,
            gates_stride: steps * row,
            prev: t * hidden,
            next: (t + 1) * hidden,
            state_stride: (steps + 1) * hidden,
        }
    }

    /// A decoding step of `rows` sequences: gates `[rows, chunks *
    /// hidden]`, states `[rows, 2, hidden]` read from slot `prev` (0 or 1)
    /// and written to the other.
    pub fn between_slots(cell: CellGates, rows: usize, hidden: usize, prev: usize) -> Self {
        LstmStep {
            cell,
            rows,
            hidden,
            gates_offset: 0,
            gates_stride: cell.chunks() * hidden,
            prev: prev * hidden,
            next: (1 - prev) * hidden,
            state_stride: 2 * hidden,
        }
    }

    /// Pre-activations in a row of gates.
    pub fn row(&self) -> usize {
        self.cell.chunks() * self.hidden
    }

    /// Elements the step reaches in the gates and in each state tensor.
    pub fn required_lens(&self) -> (usize, usize) {
        let last_row = self.rows.saturating_sub(1);
        let gates = self.gates_offset + last_row * self.gates_stride + self.row();
        let state = self.prev.max(self.next) + last_row * self.state_stride + self.hidden;
        (gates, state)
    }

    /// Panics unless the gates and the states hold what the step reaches,
    /// a state row holds both slots apart, and a gates row its gates.
    pub fn check(&self, gates: usize, states: &[usize]) {
        let (need_gates, need_state) = self.required_lens();
        let apart = self.prev.abs_diff(self.next) >= self.hidden;
        assert!(
            apart
                && self.gates_stride >= self.row()
                && self.state_stride >= self.prev.max(self.next) + self.hidden
                && gates >= need_gates
                && states.iter().all(|&n| n >= need_state),
            "lstm step: gates of {gates} and states of {states:?} elements for {self:?}"
        );
    }

    /// `check` for the backward's tensors, and `d_cell` `[rows, hidden]`.
    pub fn check_backward(&self, gates: usize, d_gates: usize, states: &[usize], d_cell: usize) {
        self.check(gates.min(d_gates), states);
        assert!(
            d_cell >= self.rows * self.hidden,
            "lstm step: d_cell of {d_cell} elements for {self:?}"
        );
    }
}
