#!/usr/bin/env python3
"""A multiple-choice task from the King James Bible (data/kjv.txt), for omnitron's
downstream evaluation (train --eval-task, omnitron evaluate --task): each example is a
verse cut in two, the context being the verse before it and the first part of the verse,
as the corpus lays them out; the choices are the true rest of the verse and the rests of
three verses from other chapters, of the same length or nearly.

    python3 scripts/make_kjv_task.py [--examples 500] [--seed 1] [--cut word|mid-word]
        [--corpus data/kjv.txt] [--output build/kjv_endings.jsonl]

--cut word cuts between two words; --cut mid-word (the default) cuts inside a word of
four letters or more, after its first one to three letters, so that the context ends with
the beginning of a word: a model that knows the text's words and phrases tells the true
rest from the others, one that does not picks at chance (0.25).

The corpus wraps its lines at 79 columns (greedily, verse lines start "  N "); every
choice is wrapped the same way from where the context ends, so that line breaks tell
nothing apart. Rows are {"context", "choices", "label", "target_delimiter": ""} (the
choices carry their own leading space or newline). The output is deterministic for a seed.
"""

import argparse
import json
import os
import random
import re

WIDTH = 79


def read_verses(path):
    """(chapter heading, verse lines) in corpus order."""
    verses, heading, cur = [], None, None
    for line in open(path, encoding="utf-8").read().split("\n"):
        if re.match(r"^  \d+ ", line):
            if cur:
                verses.append((heading, cur))
            cur = [line]
        elif line.strip() == "":
            if cur:
                verses.append((heading, cur))
            cur = None
        elif cur is not None:
            cur.append(line)
        else:
            heading = line.strip()
    if cur:
        verses.append((heading, cur))
    return verses


def wrap(words, column):
    """Words laid out as the corpus does from `column`, each after a space or a newline."""
    out = ""
    for w in words:
        if column + 1 + len(w) > WIDTH:
            out += "\n" + w
            column = len(w)
        else:
            out += " " + w
            column += 1 + len(w)
    return out, column


def column_after(text):
    return len(text) - (text.rfind("\n") + 1)


def cut(words, rng, mode):
    """(head words, tail words, prefix of the first tail word kept in the context)."""
    k = rng.randint(max(2, len(words) * 2 // 5), max(2, len(words) * 7 // 10))
    if mode == "word":
        return words[:k], words[k:], ""
    # The first word of four letters or more at or after k is cut after 1..3 letters.
    for j in range(k, len(words) - 1):
        letters = re.match(r"[A-Za-z]*", words[j]).group(0)
        if len(letters) >= 4:
            n = rng.randint(1, min(3, len(letters) - 2))
            return words[:j], words[j:], words[j][:n]
    return None


def ending(tail, prefix, column):
    """The rest of the verse from `column`, the context ending with `prefix`."""
    if prefix:
        first = tail[0][len(prefix):]
        rest, _ = wrap(tail[1:], column + len(first))
        return first + rest
    text, _ = wrap(tail, column)
    return text


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=os.path.join(here, "..", "data", "kjv.txt"))
    p.add_argument("--output", default=os.path.join(here, "..", "build", "kjv_endings.jsonl"))
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cut", choices=["word", "mid-word"], default="mid-word")
    p.add_argument("--words", type=int, default=0,
                   help="with --cut word: the choices are the next N words only, the others "
                        "N words from other chapters of exactly the same length (0: the rest "
                        "of the verse)")
    a = p.parse_args()
    rng = random.Random(a.seed)
    verses = read_verses(a.corpus)
    # Verses the corpus wraps as wrap() does (98.7% of them), of 12 words or more, after
    # another verse of their chapter.
    usable = []
    for i in range(1, len(verses)):
        (heading, lines), (prev_heading, _) = verses[i], verses[i - 1]
        words = " ".join(lines).split()
        if heading != prev_heading or len(words) < 13:
            continue
        if "  " + words[0] + wrap(words[1:], 2 + len(words[0]))[0] != "\n".join(lines):
            continue
        usable.append(i)
    # Every candidate's cut, drawn once: a verse's tail is a distractor as it was cut.
    cuts = {}
    for i in usable:
        c = cut(" ".join(verses[i][1]).split(), rng, a.cut)
        if c:
            cuts[i] = c
    chosen = rng.sample(sorted(cuts), a.examples)
    by_length = sorted(cuts, key=lambda j: len(" ".join(cuts[j][1])))
    # --words N: every verse's first N words after its cut, by their length.
    spans = {}
    for j, (_, tail, _) in cuts.items():
        if a.words > 0 and len(tail) >= a.words:
            words = tail[:a.words]
            spans.setdefault(len(" ".join(words)), []).append((j, words))
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    with open(a.output, "w", encoding="utf-8") as out:
        for i in chosen:
            heading, lines = verses[i]
            head, tail, prefix = cuts[i]
            column = 2 + len(head[0])
            body, column = wrap(head[1:], column)
            context = "\n".join(verses[i - 1][1]) + "\n  " + head[0] + body
            if prefix:  # the word's beginning, where the corpus puts it
                if column + 1 + len(tail[0]) > WIDTH:
                    context += "\n" + prefix
                    column = len(prefix)
                else:
                    context += " " + prefix
                    column += 1 + len(prefix)
            true_ending = ending(tail, prefix, column)
            if a.words > 0 and not prefix:
                words = tail[:a.words]
                true_ending = ending(words, "", column)
                pool = [w for j, w in spans[len(" ".join(words))]
                        if verses[j][0] != heading and w != words]
                others = []
                for w in rng.sample(pool, len(pool)):
                    text = ending(w, "", column)
                    if text not in others:
                        others.append(text)
                    if len(others) == 3:
                        break
                if len(others) < 3:
                    continue
                label = rng.randrange(4)
                choices = others[:label] + [true_ending] + others[label:]
                out.write(json.dumps({"context": context, "choices": choices, "label": label,
                                      "target_delimiter": ""}) + "\n")
                continue
            # Distractors: the tails of verses from other chapters among the 30 next shorter
            # and 30 next longer ones (so that a model that knows nothing, whose
            # log-likelihood is about -length x log 256, picks at chance), as they were cut;
            # inside a word, the rest of their cut word follows the context's beginning.
            at = by_length.index(i)
            pool = [j for j in by_length[max(0, at - 30):at + 31] if verses[j][0] != heading]
            others = []
            for j in rng.sample(pool, len(pool)):
                _, other_tail, other_prefix = cuts[j]
                if prefix:
                    rest = other_tail[0][len(other_prefix):]
                    other_tail = [prefix + rest] + other_tail[1:]
                text = ending(other_tail, prefix, column)
                if text != true_ending and text not in others:
                    others.append(text)
                if len(others) == 3:
                    break
            label = rng.randrange(4)
            choices = others[:label] + [true_ending] + others[label:]
            out.write(json.dumps({"context": context, "choices": choices, "label": label,
                                  "target_delimiter": ""}) + "\n")
    print(f"wrote {a.examples} examples ({a.cut} cuts) to {a.output}")


if __name__ == "__main__":
    main()
