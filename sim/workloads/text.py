"""Deterministic filler text whose token count is exact under ``WordTokenizer``.

Traces record lengths, not text, and synthetic workloads only need text of a given
length.  Every word here is plain lowercase letters, so under the shared
``WordTokenizer`` each word (with the single space before it) is exactly one token:
``n`` words make ``n`` tokens.  Text blocks that begin with a space can be
concatenated without two words fusing, which is what lets the Mooncake reader
glue 512-token blocks into one prompt with an exact total.

Randomness comes from ``random.Random`` seeded with a string: that seeding is
stable across processes and Python versions (it hashes the string with SHA-512),
unlike ``hash()``.
"""

from __future__ import annotations

import random

# Kept as one string so the list reads like prose; split once at import.
_WORD_LIST = """
    able about above accept across action active actual adapt add address admit adult
    advance advice affect after again against agent agree ahead allow almost alone along
    already also always amount analyze ancient angle animal answer anyone appear apply
    approach area argue arrive article artist assume attack attend author autumn avoid
    balance ballot banner barrel basic basket battle beach beauty become before begin
    behind believe below benefit beyond bicycle billion biology bitter blanket board
    border bottle bottom branch bread bridge brief bright bring broad brother budget
    build burden button cabin cable camera campaign candle canvas capital captain carbon
    career carpet castle casual cattle ceiling center century chain chamber channel
    chapter charge chicken choice circle citizen claim classic clever client climate
    clock cloud coast coffee collect colony column combine comfort common compare
    complex concept concert conduct confirm connect consider contain context control
    corner cotton council counter country courage course cousin cover craft create
    credit crisis critic crowd crystal culture current custom cycle damage dance danger
    debate decade decide define degree deliver demand depend deposit desert design
    detail develop device dialog differ digital dinner direct discover display distant
    divide doctor domain double dozen draft drama dream driver during duty eager early
    earth easily economy editor effect effort eight either elbow elect element elephant
    emerge empire enable energy engine enough enter entire equal escape essay estate
    event evidence exact example expand expect expert explain export extend fabric
    factor fairly family famous farmer fashion father feature federal figure filter
    final finger finish flavor flight flower follow forest forget formal fortune forward
    fossil frame freedom friend frozen future galaxy garden gather general gentle giant
    glance global golden govern gravity ground growth guard guest guitar habit hammer
    handle harbor harvest health heavy height helmet hidden history hollow honest horizon
    humble hunger hybrid ideal ignore image impact import improve include income index
    infant inform inner insect inside instant intend invest island jacket journey judge
    jungle junior justice kernel kettle kitchen ladder language laptop latter launch
    layer leader league legend lemon lesson letter level liberty limit liquid listen
    little local lonely lumber machine magnet major manage manner marble margin market
    master matrix meadow measure medal member memory mental method middle minute mirror
    mobile modern moment monkey motion mountain muscle museum mutual narrow nation nature
    needle neither network neutral night noble normal notice novel number object obtain
    ocean office online option orange orbit order origin outcome output oxygen paddle
    palace panel parent parrot pattern pencil people pepper period permit person phrase
    pilot planet plastic player pocket poetry policy portion powder predict present
    pretty prison private problem process produce profit program project proper protect
    public purple puzzle quality quarter question quick rabbit radar random rapid rather
    reason recall record reduce reform region relax remain remote repair report rescue
    result return reveal review reward rhythm ribbon river rocket rubber saddle safety
    salmon sample saturn scale scheme school science screen search season second secret
    select senior series session settle shadow shelter signal silver simple single
    sister sketch social soldier source space speak spirit spring square stable station
    steady stomach stone strategy stream street strong studio subject summer sunset
    supply surface survey switch symbol system talent target teacher temple tennis theory
    thread ticket timber tissue title tomato toward tower traffic travel treaty trend
    tribe tunnel turtle twelve typical umbrella uncle unique update upper useful valley
    vendor verify vessel victory village violin virtue vision visit volume voyage wagon
    wallet wander warrior weather welcome window winter wisdom wonder wooden worker world
    writer yellow yield young zebra
"""
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())


def seeded(*parts: object) -> random.Random:
    """A generator seeded from ``parts``, identical in every process."""
    return random.Random("/".join(str(part) for part in parts))


def word_text(rng: random.Random, tokens: int) -> str:
    """``tokens`` random words separated by spaces: exactly ``tokens`` tokens."""
    return " ".join(rng.choices(WORDS, k=tokens))


def spaced_text(rng: random.Random, tokens: int) -> str:
    """Like ``word_text`` but every word has its leading space, so pieces concatenate
    without changing each other's tokens."""
    return "".join(" " + word for word in rng.choices(WORDS, k=tokens))


def tagged_text(tag: str, rng: random.Random, tokens: int) -> str:
    """Text of exactly ``tokens`` tokens whose first token is ``tag``.

    A unique tag (letters and digits only, so it is one token) makes two such texts
    differ from their first token on, so they never share a cacheable prefix by
    accident.
    """
    if not tag.isalnum():
        raise ValueError(f"tag {tag!r} must be letters and digits only (one token)")
    if tokens <= 0:
        return ""
    rest = word_text(rng, tokens - 1)
    return f"{tag} {rest}" if rest else tag
