"""Caption tokenisation as captune and pycocoevalcap do it: Stanford's
PTB rules with lower-casing, then the punctuation tokens dropped (the
same rules as captune's src/data/tokenize.rs, which documents them)."""

DROPPED = {"''", "'", "``", "`", "-lrb-", "-rrb-", "-lcb-", "-rcb-", ".", "?", "!", ",", ":", "-",
           "--", "...", ";"}
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "inc", "co", "ltd",
                 "mt", "ave"}
CLITICS = ("'s", "'re", "'ve", "'ll", "'d", "'m")
SPLIT_WORDS = {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"),
               "wanna": ("wan", "na")}
BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}


# Unicode's White_Space characters, as Rust's char::is_whitespace reads
# them (Python's str.isspace also takes U+001C to U+001F).
WHITESPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def nbytes(s):
    # captune measures words in UTF-8 bytes.
    return len(s.encode("utf-8"))


def ptb_tokenize(text):
    return [t for t in ptb_tokens(text.lower()) if t not in DROPPED]


def ptb_tokens(text):
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c in WHITESPACE:
            i += 1
        elif c in BRACKETS:
            out.append(BRACKETS[c])
            i += 1
        elif c == '"':
            out.append("''")
            i += 1
        elif c in ";!?,:":
            out.append(c)
            i += 1
        else:
            start = i
            while i < len(text) and in_word(text, i):
                i += 1
            split_word(text[start:i], out)
    return out


def in_word(text, i):
    c = text[i]
    if c in WHITESPACE or c == '"' or c in BRACKETS or c in ";!?":
        return False
    if c in ",:":
        digit = lambda j: 0 <= j < len(text) and text[j] in "0123456789"
        return digit(i - 1) and digit(i + 1)
    return True


def split_word(w, out):
    leading, trailing = [], []
    while True:
        if w.startswith("--"):
            leading.append("--")
            w = w[2:]
        elif nbytes(w) > 1 and w[0] in "-`$'" and w not in CLITICS:
            leading.append("`" if w[0] == "'" else w[0])
            w = w[1:]
        else:
            break
    while True:
        if w.endswith("..."):
            trailing.append("...")
            w = w[:-3]
        elif w.endswith("--"):
            trailing.append("--")
            w = w[:-2]
        elif nbytes(w) > 1 and w.endswith(".") and not is_abbreviation(w):
            trailing.append(".")
            w = w[:-1]
        elif nbytes(w) > 1 and w[-1] in "-%'":
            trailing.append(w[-1])
            w = w[:-1]
        else:
            break
    out.extend(leading)
    split_clitic(w, out)
    out.extend(reversed(trailing))


def is_abbreviation(w):
    stem = w[:-1]
    return "." in stem or stem in ABBREVIATIONS


def split_clitic(w, out):
    if not w:
        return
    if w in SPLIT_WORDS:
        out.extend(SPLIT_WORDS[w])
    elif nbytes(w) > 3 and w.endswith("n't"):
        out.extend([w[:-3], "n't"])
    else:
        clitic = next((c for c in CLITICS if nbytes(w) > len(c) and w.endswith(c)), None)
        if clitic:
            out.extend([w[: -len(clitic)], clitic])
        else:
            out.append(w)
