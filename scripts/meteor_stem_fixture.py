#!/usr/bin/env python3
"""Stems from the Snowball English stemmer inside METEOR 1.5's jar, for
the tests of `src/metrics/meteor/stem.rs`: a hand-written list that
touches every rule of the algorithm, and seeded random combinations of its
suffixes, letters and prefixes. (Real captions' words are stemmed in the
METEOR tests on Flickr8k, which read the data set.) Needs Java 11+ (it
runs a single source file).

    pip install pycocoevalcap   # ships meteor-1.5.jar
    python3 scripts/meteor_stem_fixture.py

writes tests/data/meteor/stems.tsv: `word<TAB>stem` per line, UTF-8, sorted
by word (the first line is the empty word). The hand list's non-ASCII words
are written as escapes so that this file stays ASCII.
"""
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "meteor", "stems.tsv")

# The wrapper that METEOR's aligner calls, one instance reused for every word.
JAVA = r"""
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import edu.cmu.meteor.aligner.SnowballStemmerWrapper;
import org.tartarus.snowball.ext.englishStemmer;

public class Stems {
    public static void main(String[] args) throws Exception {
        SnowballStemmerWrapper stemmer = new SnowballStemmerWrapper(new englishStemmer());
        StringBuilder out = new StringBuilder();
        for (String word : Files.readAllLines(Paths.get(args[0]), StandardCharsets.UTF_8)) {
            out.append(word).append('\t').append(stemmer.stem(word)).append('\n');
        }
        Files.write(Paths.get(args[1]), out.toString().getBytes(StandardCharsets.UTF_8));
    }
}
"""

# One group per rule of https://snowballstem.org/algorithms/english/stemmer.html
# (and the places where later versions of it changed).
HAND = """
    skis skies dying lying tying idly gently ugly early only singly
    'skis Skis 'sky 'news skis' sky's
    sky news howe atlas cosmos bias andes
    ski skied skying dyings lyings idlyness uglyness earlyish onlys skyes newss
    inning innings outing outings canning cannings herring herrings earring earrings
    proceed proceeds proceeded proceeding exceed exceeds exceeded exceeding
    succeed succeeds succeeded succeeding beginning evening evenings outings'
    generate generates generated generation generations general generally generous
    generic genera gener communication communications communicate community
    communism commune communal commun arsenal arsenals arsenic arsen arsenical
    universal university universe universally organ organization organize organic
    organism emergency emerge emergent later lateral latest past pastoral pasture
    paste pasted pasting internal international interval added adding egged
    erred odder vying hying biologists
    'apostrophe 'tis 'twas ''double ''s' '''s 'y 'yes 'a 'ab 'abc ' '' ''' 's 's' 'ss
    dog's dogs' dogs's boss's bosses' james' james's it's that's o'clock rock'n'roll
    y yy yyy ya yes yet you yellow yelling yearly yield youth young
    say sayer sayers sayings player played playing toy toys toying boy boyish
    eye eyes eyeing buy buyer buying enjoy enjoyed enjoyment
    ayy sayy ayyy boyy yay yayy yoyo yoyos
    caresses sses ponies ties tied cries cried died dies pies lies ied ies
    gas gaps kiwis consensus this his us ss bus plus thus gus hiss kiss
    bleed bleeds agreed agreedly feed feedly deed indeed guaranteed emceed
    hoped hoping hopped hopping fitted fitting luxuriated luxuriating
    troubled troubling sized sizing bled ring sing bring sting hing ed ing
    fizzed fizzing failed failing filed filing
    hopeful hoped hopedly hopingly shed shred shredded shredding
    cry by happy cry sky enjoy ably bay cay say
    yelled rapping robbing tanning capped wedding digging ramming runner
    cuddly ruffled hugged sped
    relational rational conditional valency hesitancy digitizer
    vietnamization predication operator feudalism formaliti formality
    sensibility sensibiliti hopefulness callousness decisiveness sensitivity
    analogi analogy biology biologist geology fruitfully fearlessly
    ally bully busily easily elegantly happily quickly slowly softly
    truly partly closely ghostly nicely quietly actively
    electrical electricity electrically triplicate formative formalize
    electriciti hopefulness goodness careful carefulness rationality
    revival allowance inference airliner gyroscopic adjustable defensible
    irritant replacement adjustment dependent adoption communism activate
    angulariti homologous effective bowdlerize
    agreement movement statement element cement basement settlement
    position question adoption vision mission station region onion
    lion union nation fashion cushion
    probate rate cease controll roll fall hall ball well all
    ravel gravel dwell spell able table
    discharge discharged charge charging tennis bounces
    rational nationality international rationalize
    skateboarding skateboarder skateboarders snowboarding snowboard
    running swimming jumping climbing biking hiking riding sitting standing
    walking playing looking holding wearing smiling laughing
    a an i is it at be to of on in up ox
    abc aed aing bed bing sing red spied dried owed owing awed axed axing abed
    opted ebbed upped ow ox owe oxen eyeing
    0 1 12 123 2000 1990s 3d 4th 1st 2nd x-ray t-shirt t-shirts e-mail
    well-dressed multi-colored black-and-white 3-year-old
    caf\u00e9 caf\u00e9s na\u00efve na\u00efvely \u00fcber \u00fcbers r\u00e9sum\u00e9
    jalape\u00f1os pi\u00f1ata pi\u00f1atas fa\u00e7ade fa\u00e7ades \u00e9t\u00e9
    ni\u00f1os se\u00f1or stra\u00dfe \u00e6sthetic \u00e6ons
    \u00e9\u00e9 \u00e9\u00e9s \u00e9y \u00e9ies \u00e9\u00e9ing \u00e9ed
    \u0441\u043b\u043e\u0432\u043e \u4e2d\u6587 \u4e2d\u6587s
    \U0001f600 \U0001f600s \U0001f600y \U0001f600ies \U0001f600\U0001f600s
    a\U0001f600s \U0001f600as x\U0001f600y \U0001f600sses \U0001f600ied
    DOGS Running SKIES Sky YES Yes yES sayY SaY YaY yaY
""".split()


# Seeded random strings built from the suffixes and letters the rules look
# at, so that their combinations (and odd characters) are covered too.
PIECES = """
    a e i o u y b c d g l n r s t w x z Y ' \u00e9 \U0001f600
    ing ingly ed edly eed eedly ied ies sses ss us 's 's' y li bli abli alli entli
    ousli fulli lessli ogi enci anci izer ization ational tional ation ator alism
    aliti iviti biliti iveness ousness fulness alize icate iciti ical ful ness
    ative al ance ence er ic able ible ant ement ment ent ism ate iti ous ive ize
    ion sion tion at bl iz bb dd ff gg mm nn pp rr tt cc ll gener commun arsen
""".split()


def random_words(count, seed=1):
    rng = random.Random(seed)
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5))))
    return words


def main(jar):
    words = sorted(set(HAND) | random_words(8000) | {""})
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "Stems.java")
        with open(source, "w", encoding="utf-8") as f:
            f.write(JAVA)
        inputs, outputs = os.path.join(tmp, "words.txt"), os.path.join(tmp, "stems.tsv")
        with open(inputs, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(w + "\n" for w in words))
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        subprocess.run(["java", "-cp", jar, source, inputs, outputs], check=True)
        with open(outputs, encoding="utf-8", newline="\n") as f:
            lines = f.read().split("\n")[:-1]
    assert len(lines) == len(words), (len(lines), len(words))
    for word, line in zip(words, lines):
        assert line.split("\t")[0] == word, (word, line)
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))
    print(f"{len(lines)} words -> {OUT}")


if __name__ == "__main__":
    from pycocoevalcap.meteor import meteor

    main(os.path.join(os.path.dirname(meteor.__file__), "meteor-1.5.jar"))

