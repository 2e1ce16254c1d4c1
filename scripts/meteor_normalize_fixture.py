#!/usr/bin/env python3
"""Expected METEOR 1.5 normalisation for English, made by the jar itself:
each line goes through `edu.cmu.meteor.util.Normalizer.normalizeLine(line,
LANG_EN, true).toLowerCase()`, which is what `java -jar meteor-1.5.jar - -
-stdio -l en -norm` (pycocoevalcap's METEOR) does to every hypothesis and
reference before aligning them.

    pip install pycocoevalcap   # ships meteor-1.5.jar; needs Java 11+
    python3 scripts/meteor_normalize_fixture.py

writes
- tests/data/meteor/normalize.jsonl: one {"line", "normalized"} a line:
  hand-written lines that hit every rule of the normaliser, then the same
  lines through pycocoevalcap's PTBTokenizer (lowercased, punctuation
  dropped), as captions reach METEOR in an evaluation (Flickr8k's own
  captions are covered by the METEOR tests, which read the data set);
- tests/data/meteor/english.prefixes: the jar's nonbreaking-prefix list
  (from Moses, LGPL), which the tests hand to `Normalizer::new`.

Lines travel to Java hex-encoded, so tabs, carriage returns and other
control characters inside a line reach the normaliser unchanged.
"""
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "data", "meteor")

JAVA = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import edu.cmu.meteor.util.Constants;
import edu.cmu.meteor.util.Normalizer;

public class Norm {
    static byte[] unhex(String s) {
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++)
            b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return b;
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) sb.append(String.format("%02x", x & 0xff));
        return sb.toString();
    }

    public static void main(String[] args) throws IOException {
        System.err.println("locale " + Locale.getDefault());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            String text = new String(unhex(line.trim()), StandardCharsets.UTF_8);
            String norm = Normalizer.normalizeLine(text, Constants.LANG_EN, true).toLowerCase();
            out.println(hex(norm.getBytes(StandardCharsets.UTF_8)));
        }
    }
}
"""

# Hand-written lines, grouped by the rule they exercise.
HAND = [
    # empty, blank, punctuation only
    "", " ", "\t", "   \t  ", ".", "..", "...", "....", "!!!", "?!", ",", ",,,", ".,.,",
    "'", "''", "'''", "-", "--", "---", "—", "\"", "\"\"", "'.'", "( )", "[]", "...!?", "- -",
    # commas inside and outside numbers
    "1,000 dogs", "a,b", "dogs,cats, and birds", "1,a", "a,1", "3,4,5", ",leading", "trailing,",
    "1,,2", "a , b", "12,345,678 people", "In 1990,2 dogs ran", "x,y,z", "1, 2, 3",
    # multiple dots
    "wait...", "wait... what", "Wait... What", "a..b", "a...b", "a....b", "end.", "A. B",
    "x.y.z", "x.y.z.", "dog... .", ". . .", "..a", "a..", "so..... yes", "1...2", "U.S...",
    # nonbreaking prefixes: end of line and mid-line
    "Mr. Smith walks.", "Talk to Mr.", "talk to mr.", "He lives in the U.S.", "The U.S. flag",
    "a U.S.-based firm", "No. 5 is here", "No. five", "No. Five", "No.", "It is No.5",
    "see pp. 12", "see pp. iv", "see pp. XII", "Art. 3 says", "Art. Deco", "Nos. 4 and 5",
    "Nr. 7", "cats vs. dogs", "cats vs dogs.", "Acme Inc. is a company", "Acme Inc. Is",
    "Dr. Who", "Dr.Who", "DR. NO", "A. Lincoln", "I. am", "St. Louis", "at 3 p.m. today",
    "at 5 p.m.", "J.R.R. Tolkien wrote it.", "e.g. dogs", "i.e. cats", "E.g. dogs", "e.g.",
    "a dog, a cat, etc.", "dogs etc. and more", "etc. Then", "U.S.A.", "U.S.A", "u.s. dogs",
    "Prof. X and Sgt. Pepper", "Gen. Lee.", "Capt.", "v. Wade", "rev. 2", "Ph. D.", "Ph.D.",
    "the dog. the cat.", "The dog. The cat.", "Dog. élan", "Dog. 5", "the end. ", "5. dogs",
    "1.5.", "Ave. Maria", "Mt. Everest", "MR. BIG", "MRS. Doubtfire", "MM. Dupont", "Q. E. D.",
    # numbers with dots, money, time, percent
    "3.14 is pi", "$5.00", "costs $5.00.", "version 1.2.3", "1.", "10.5%", "0.5.", "3:30",
    "at 3:30 pm", "1/2 cup", "#1 dog", "50% off", "No.1", "12.", "1,000.50", "-5 degrees",
    "2×3", "6÷2", "1-2", "24/7", "£10", "€5,50", "¥100", "5'10\"",
    # quotes of all kinds
    "\"quoted\"", "a \"quoted\" word", "''double''", "``ptb``", "“curly”", "a “curly” quote",
    "‘single’", "'single'", "it’s", "don’t", "`backtick`", "``", "„low“", "«guillemets»",
    "‹one›", "″double prime″", "′prime′", "ʼmodifierʼ", "a''b", "a ' ' b", "'' a ''",
    # dashes
    "a - b", "a -- b", "a---b", "a----b", "em—dash", "a — b", "en–dash", "a – b", "a –– b",
    "well-known", "t-shirt", "-leading", "trailing-", "x--y", "e-mail", "E-Mail", "re-re-re",
    "a-b-c-d", "1-a", "a-1", ".-a", "U.S.-based", "mid-1990s", "co-op's", "‐hyphen‐", "−minus",
    # contractions and apostrophes
    "can't", "won't", "it's", "dogs' toys", "the dog's bone", "the dog 's bone", "1990's",
    "the 90's", "'s", "' s", "rock 'n' roll", "'tis", "y'all", "o'clock", "O'Neil", "3'4",
    "l'homme", "children 's toys", "Don’t", "DON'T", "'hello'", "dogs'", "a'", "'a", "1'a",
    "1's", "a'1", "é's", "Д'А", "the '60s", "'90s", "it''s", "can`t", "'' '", "x'y'z",
    # HTML-ish text and markup
    "&amp;", "AT&amp;T", "&quot;hi&quot;", "&lt;b&gt;", "AT&T", "a & b", "<b>bold</b>",
    "a&b", "&#39;",
    # brackets, slashes and other symbols
    "(a)", "[b]", "{c}", "a(b)c", "-LRB- x -RRB-", "and/or", "http://example.com/a.b",
    "a\\b", "@user", "a+b=c", "*star*", "~tilde~", "^caret^", "a|b", "a|||b", "<>",
    "_under_score_", "snake_case", "a;b", "a:b", "what?", "what?!", "hey!", "x=1",
    # letters outside ASCII: accents, other scripts, emoji
    "café", "naïve", "Ærø", "Straße", "ŠKODA", "Ÿ", "ß", "İstanbul", "ΣΟΦΙΑ", "ΟΔΥΣΣΕΥΣ ΝΙΚΟΣ",
    "Οδυσσεύς", "Москва, Россия.", "Ёлка-палка", "日本語のテキスト。", "😀 smile", "dog😀",
    "👍🏽", "e\u0301", "ﬁne", "ǅ", "Ⅻ", "Ａbc", "مرحبا، عالم", "Åland", "µm", "ª", "º", "¹²",
    "١٢٣", "１２３", "ʻokina", "ẞ", "ĲSSEL", "ŉ", "Ǆ", "ſ", "Ω", "K", "ǈ", "Σ.", "ΑΣ.",
    "Ꙁ", "ᴀ", "ꚗ", "Ԧ", "Ӂ", "dogs—😀—cats", "x\u200dy",
    # whitespace and control characters
    "a\tb", "a  b", "  leading and trailing  ", "\ttab", "a\u00a0b", "a\u2003b", "a\u3000b",
    "a\u200bb", "a\u000bb", "a\u000cb", "a\rb", "a\u0001b", "\u007f", "a\u2028b", "a\u0085b",
    "\u00a0", "\u3000 x \u3000", " \u000b ", "a\u001fb", "tab\t.", "a .\tb",
    # the escape words the normaliser uses internally
    "DOTMULTI", "DOTMULTI.x", "DOTDOTMULTI", "dotmulti", "aDOTMULTI..b", "DOTMULTI...",
    # capitalisation
    "A Dog Runs.", "THE DOG.", "A DOG RUNS ACROSS THE FIELD .", "McDonald's",
    # longer mixed lines
    "A man, wearing a \"U.S.A.\" t-shirt -- and jeans -- walks past No. 10 at 3:30 p.m.",
    "Two dogs ( one brown , one black ) play ; the third watches ... why ?",
    "She said: “It’s Mr. O’Neil’s dog—isn’t it?” and left.",
    "Kids' toys, e.g. balls, cost $1,000.00 (approx.) in the U.K.",
    " ".join(["word."] * 40),
    "a" * 300 + "." + "b" * 300,
]


def ptb_tokenize(lines):
    """pycocoevalcap's PTBTokenizer (Stanford CoreNLP 3.4.1, lowercased,
    punctuation tokens dropped), one line per input line."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    out = PTBTokenizer().tokenize({i: [{"caption": c}] for i, c in enumerate(lines)})
    return [out[i][0] for i in range(len(lines))]


def jar_path():
    import pycocoevalcap.meteor.meteor as m

    return os.path.join(os.path.dirname(os.path.abspath(m.__file__)), "meteor-1.5.jar")


def normalize_with_jar(jar, lines):
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "Norm.java")
        with open(src, "w") as f:
            f.write(JAVA)
        stdin = "".join(line.encode("utf-8").hex() + "\n" for line in lines)
        run = subprocess.run(
            ["java", "-cp", jar, src], input=stdin.encode(), capture_output=True, check=True
        )
    err = run.stderr.decode()
    sys.stderr.write(err)
    if "Error" in err or "Exception" in err:
        sys.exit("the jar's normaliser reported an error")
    out = run.stdout.decode().split("\n")[: len(lines)]
    assert len(out) == len(lines), (len(out), len(lines))
    return [bytes.fromhex(h.strip()).decode("utf-8") for h in out]


def main():
    jar = jar_path()
    os.makedirs(OUT_DIR, exist_ok=True)
    with zipfile.ZipFile(jar) as z:
        prefixes = z.read("nonbreaking/english.prefixes")
    with open(os.path.join(OUT_DIR, "english.prefixes"), "wb") as f:
        f.write(prefixes)

    lines = HAND + ptb_tokenize(HAND)
    normalized = normalize_with_jar(jar, lines)
    path = os.path.join(OUT_DIR, "normalize.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for line, norm in zip(lines, normalized):
            f.write(json.dumps({"line": line, "normalized": norm}, ensure_ascii=False) + "\n")
    print(f"{len(lines)} lines -> {os.path.relpath(path, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
