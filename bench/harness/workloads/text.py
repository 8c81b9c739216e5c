"""Synthetic agent text that compresses like real text: prose, code, logs, test logs, listings, grep output.

Drawn from a fixed vocabulary with Zipf-like word frequencies, so zstd -3 finds
roughly the 3-6x it finds on real agent text, rather than the extremes of random
bytes or repeated filler.
"""

from __future__ import annotations

import itertools
import random

# Word lists read better as text than as list literals.
_COMMON = """
the of and to a in is it that for on with as was this be are by at from or an have not but can all which one
will there their more if when so what about up out some them into would time only other then its also after
two first how new any these may use because each way where most over such need we you they he she i my our
your has had were been being do does did done should could must might here now just than very still again
never always often before while since until under between through during without within against around make
made see seen look find found give take know think want like get got keep let put say said show tell try
call come go work seem feel leave mean help turn start stop begin end move live hold bring happen write read
provide sit stand lose pay meet include continue set learn lead understand watch follow change create speak
allow add spend grow open walk win offer remember consider appear buy wait serve die send expect build stay
fall cut reach kill remain suggest raise pass sell require report decide pull good great small large long
little own old right big high different same next early young important few public bad able last late hard
major better best sure free full special clear whole certain real left possible likely recent strong true
""".split()  # noqa: SIM905
_TECH = """
file test value error cache state step check run update return function module class method request response
server client version session store frame chain patch delta merge replace data result output input token
model agent tool plan task user message summary config option default path line build commit branch review
retry timeout limit size count index key list map string number buffer stream queue worker thread process
memory disk network log level warning info debug trace failure success pending parse format schema field
record entry table query row column handler context event payload header status code reader writer offset
length flag mode node graph edge batch job lock mutex channel socket port host address route proxy backend
auth user account order flight booking price date name email address item cart invoice
""".split()  # noqa: SIM905


def _zipf_cumulative(n: int) -> list[float]:
    # Rank-frequency ~ 1/(rank + 3): a few words dominate, as in real text,
    # which is what puts zstd's ratio on this text near real prose (~3x).
    return list(itertools.accumulate(1.0 / (rank + 3) for rank in range(n)))


def _build_vocab() -> tuple[list[str], list[str]]:
    # A fixed RNG: the vocabulary is part of the workload definition.
    rng = random.Random("ckpt-bench/vocab")
    syllables = ["ka", "lo", "mi", "ne", "tor", "sen", "rat", "vel", "ion", "ex", "pro", "dis"]
    syllables += ["con", "mar", "lin", "gen", "per", "tra", "pol", "ver", "sta", "mon", "ric", "del"]
    rare = sorted({"".join(rng.choices(syllables, k=rng.randint(2, 4))) for _ in range(2500)})
    rng.shuffle(rare)
    words = list(dict.fromkeys(_COMMON + _TECH + rare))
    tech = list(dict.fromkeys(_TECH))
    idents = sorted({"_".join(rng.sample(tech, rng.randint(1, 3))) for _ in range(900)})
    rng.shuffle(idents)
    return words, idents


_WORDS, _IDENTS = _build_vocab()
_WORDS_CUM = _zipf_cumulative(len(_WORDS))
_IDENTS_CUM = _zipf_cumulative(len(_IDENTS))
_REUSE = 0.3
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARNING", "ERROR")


class Text:
    """Realistic-ish text from one session's RNG.

    Words are drawn in bulk (one ``choices`` call per paragraph) because 20 MB of
    text must build in a couple of seconds.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._log_ms = rng.randrange(86_400_000)
        # Sentences the agent already said: agents repeat themselves ("let me
        # run the tests again"), which is much of why real transcripts compress.
        self._stock: list[str] = []

    def words(self, n: int) -> list[str]:
        return self.rng.choices(_WORDS, cum_weights=_WORDS_CUM, k=n)

    def idents(self, n: int) -> list[str]:
        return self.rng.choices(_IDENTS, cum_weights=_IDENTS_CUM, k=n)

    def sentence(self, lo: int = 6, hi: int = 18) -> str:
        text = " ".join(self.words(self.rng.randint(lo, hi)))
        return text[:1].upper() + text[1:] + "."

    def prose(self, chars: int) -> str:
        """About ``chars`` characters (never more) of sentences."""
        rng, stock = self.rng, self._stock
        words = self.words(chars // 5 + 8)
        sentences = []
        i = 0
        while i < len(words):
            if len(stock) >= 32 and rng.random() < _REUSE:
                sentences.append(rng.choice(stock))
                i += 10
                continue
            k = rng.randint(6, 18)
            text = " ".join(words[i : i + k])
            sentence = text[:1].upper() + text[1:] + "."
            sentences.append(sentence)
            if len(stock) < 512:
                stock.append(sentence)
            i += k
        text = " ".join(sentences)
        while len(text) < chars:  # short words: top up
            text += " " + self.sentence()
        cut = text.rfind(" ", 0, chars + 1)
        return text[: cut if cut > 0 else chars]

    def code_lines(self, n: int) -> list[str]:
        rng = self.rng
        names = self.idents(4 * n + 4)
        lines: list[str] = []
        depth = 1
        for i in range(n):
            a, b, c, d = names[4 * i : 4 * i + 4]
            pad = "    " * depth
            kind = rng.random()
            if kind < 0.06 or depth == 0:
                lines.extend(("", "", f"def {a}({b}, {c}: int = {rng.randrange(100)}) -> {d.title()}:"))
                depth = 1
                continue
            if kind < 0.30:
                lines.append(f"{pad}{a} = {b}.{c}({d}, {rng.randrange(1000)})")
            elif kind < 0.42:
                lines.append(f"{pad}if {a} is None or {b} > {rng.randrange(64)}:")
                depth = min(depth + 1, 4)
                continue
            elif kind < 0.52:
                lines.append(f"{pad}for {a} in {b}.{c}():")
                depth = min(depth + 1, 4)
                continue
            elif kind < 0.62:
                lines.append(f"{pad}# {' '.join(self.words(rng.randint(4, 12)))}")
            elif kind < 0.72:
                lines.append(f"{pad}self.{a}[{b}] = {c}")
            elif kind < 0.80:
                lines.append(f'{pad}raise {d.title().replace("_", "")}Error(f"{a} {{{b}}} is not {c}")')
            elif kind < 0.88:
                lines.append(f"{pad}{a}.append({b}[{c}])")
            else:
                lines.append(f"{pad}return {a}")
            if depth > 1 and rng.random() < 0.3:
                depth -= 1
        return lines

    def code(self, chars: int) -> str:
        names = self.idents(3 * 6)
        lines = [f"from {a} import {b}, {c}" for a, b, c in zip(names[0::3], names[1::3], names[2::3], strict=True)]
        size = sum(map(len, lines))
        while size < chars:
            more = self.code_lines(64)
            lines.extend(more)
            size += sum(map(len, more)) + len(more)
        return "\n".join(lines)[:chars]

    def log(self, chars: int) -> str:
        rng = self.rng
        out: list[str] = []
        size = 0
        while size < chars:
            self._log_ms += rng.randint(1, 4000)
            ms = self._log_ms % 86_400_000
            stamp = f"2026-01-01T{ms // 3_600_000:02}:{ms // 60_000 % 60:02}:{ms // 1000 % 60:02}.{ms % 1000:03}Z"
            a, b = self.idents(2)
            line = f"{stamp} {rng.choice(_LEVELS):<7} {a}.{b}: {' '.join(self.words(rng.randint(4, 14)))}"
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def test_log(self, chars: int) -> str:
        rng = self.rng
        out = ["============================= test session starts =============================="]
        size = len(out[0])
        passed = failed = 0
        while size < chars:
            a, b, c = self.idents(3)
            if rng.random() < 0.06:
                failed += 1
                block = [
                    f"tests/test_{a}.py::test_{b} FAILED",
                    f"____________________________ test_{b} ____________________________",
                    *self.code_lines(rng.randint(3, 8)),
                    f">       assert {c} == {rng.randrange(100)}",
                    f"E       AssertionError: assert {rng.randrange(100)} == {rng.randrange(100)}",
                    f"tests/test_{a}.py:{rng.randint(10, 900)}: AssertionError",
                ]
            else:
                passed += 1
                block = [f"tests/test_{a}.py::test_{b}_{c} PASSED{'':>20}[{rng.randrange(100):>3}%]"]
            out.extend(block)
            size += sum(map(len, block)) + len(block)
        out.append(f"===== {failed} failed, {passed} passed in {rng.uniform(0.5, 90):.2f}s =====")
        return "\n".join(out)[-chars:]

    def listing(self, chars: int) -> str:
        rng = self.rng
        out = [f"total {rng.randrange(10_000)}"]
        size = len(out[0])
        while size < chars:
            a, b = self.idents(2)
            ms = rng.randrange(86_400_000)
            line = (
                f"-rw-r--r--  1 agent agent {rng.randrange(100, 90_000):>7} Jan {rng.randint(1, 28):>2}"
                f" {ms // 3_600_000:02}:{ms // 60_000 % 60:02} src/{a}/{b}.py"
            )
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def grep(self, chars: int, pattern: str) -> str:
        rng = self.rng
        out: list[str] = []
        size = 0
        while size < chars:
            a, b = self.idents(2)
            line = f"src/{a}/{b}.py:{rng.randint(1, 900)}:{self.code_lines(1)[0].rstrip()} {pattern}"
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def tool_output(self, chars: int) -> str:
        kind = self.rng.random()
        if kind < 0.3:
            return self.test_log(chars)
        if kind < 0.5:
            return self.log(chars)
        if kind < 0.65:
            return self.listing(chars)
        return self.code(chars)


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    # Tool outputs are mostly small with a long tail, not uniform in size.
    return int(lo * (hi / lo) ** rng.random())
