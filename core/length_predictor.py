"""How many tokens a request will generate, guessed before it runs (PreServe §4.2).

A request's load is its prompt, known on arrival, plus its response, known only
when it ends.  PreServe predicts the response length per request so that the
balancer can anticipate each replica's KV usage (``core.load_anticipator``)
and route on work rather than on a count of requests.

``RequestFeatures`` is what a predictor may look at: only what the balancer has
already computed for routing (the prompt's token count, ``max_tokens``, the
first block key as the system prompt's identity, the endpoint) plus a few cheap
cues: the session's earlier turns' output lengths and stable hashes of the
first and last words of the last user message.  Every cue is O(1) in the
prompt's length (``word_cues`` reads at most ``CUE_CHARS`` characters from each
end), so a 4k-token prompt costs what a 40-token one does.

A ``LengthPredictor`` predicts (``predict``: expected output tokens) and learns
online from completed requests (``observe``).  Implementations:

* ``NoPredictor``: ``max_tokens`` when the client set it, else a fixed default:
  what a router without a predictor assumes.
* ``OraclePredictor``: the true length, which only the simulator knows
  (``RequestFeatures.oracle_output``); the upper bound on what prediction buys.
* ``SessionMeanPredictor``: the mean output of the session's earlier turns, else
  the running mean of everything observed: the baseline a learned model must
  beat.
* ``core.learned_length.LearnedPredictor``: an online linear model over
  these features (kept in its own module: its library loads only where used).

``SessionHistory`` keeps the earlier turns' output lengths per session key,
bounded in sessions and turns.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.prompts import ChatPrompt, Prompt, TextPrompt

# Characters read from each end of the last user message: the instruction usually
# sits at one end ("Translate ...", "... in 3 bullet points"), and reading a fixed
# amount keeps the cost independent of the prompt's length.
CUE_CHARS = 240
# Words hashed from each end.
CUE_WORDS = 12
# Earlier turns remembered per session.
HISTORY_TURNS = 8
# What ``NoPredictor`` (and the others, before they know anything) assume when the
# client set no ``max_tokens``: vLLM's own default is "until the context is full",
# which says nothing about the expected length, so a typical chat answer is assumed.
DEFAULT_OUTPUT_TOKENS = 256

_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a length predictor may look at, all known before the request runs.

    ``system_key``: identity of the system prompt, e.g. the first block key (0: no
    full block).  ``earlier_outputs``: output tokens of the session's earlier turns,
    oldest first (bounded by ``SessionHistory``).  ``cues``: stable hashes of the
    last user message's first and last words (``word_cues``).  ``oracle_output``:
    the true length, set only by the simulator, read only by ``OraclePredictor``.
    """

    prompt_tokens: int
    max_tokens: int | None = None
    endpoint: str = "chat"
    system_key: int = 0
    earlier_outputs: tuple[int, ...] = ()
    cues: tuple[int, ...] = ()
    oracle_output: int | None = None


class LengthPredictor(Protocol):
    """Predicts a request's output tokens and learns from completed requests."""

    name: str

    def predict(self, features: RequestFeatures) -> float:
        """Expected output tokens (at least 1, at most ``max_tokens`` when set)."""
        ...

    def observe(self, features: RequestFeatures, actual_output_tokens: int) -> None:
        """A request with these features generated ``actual_output_tokens``."""
        ...


def word_cues(text: str, *, chars: int = CUE_CHARS, words: int = CUE_WORDS) -> tuple[int, ...]:
    """Stable hashes of the first and last ``words`` words of ``text`` (lower-cased),
    each end read from at most ``chars`` characters.  Head and tail words hash
    apart ("h:" and "t:"): "list" opening a request means something else than
    "list" closing one.  crc32, not ``hash``: a saved model must mean the same in
    another process (``hash`` of a str is salted per process)."""
    head, tail = _end_words(text, chars, words)
    # crc32 continued from the prefix's crc is the crc32 of prefix + word.
    cues = [zlib.crc32(word.encode(), _HEAD_CRC) for word in head]
    cues += [zlib.crc32(word.encode(), _TAIL_CRC) for word in tail]
    return tuple(cues)


_HEAD_CRC = zlib.crc32(b"h:")
_TAIL_CRC = zlib.crc32(b"t:")
# Characters scanned first at each end: 12 words of English fit in it; when fewer
# than ``words + 1`` words do, the whole ``chars`` window is scanned instead.
_FIRST_WINDOW = 96


def _end_words(text: str, chars: int, words: int) -> tuple[list[str], list[str]]:
    """The words ``_WORD`` finds in the first and in the last ``chars`` characters of
    ``text`` lower-cased: the first ``words`` and (for a text longer than ``chars``)
    the last ``words``.

    For ASCII text a shorter window gives the same words, read faster (scanning was
    most of a request's cue cost): lower-casing ASCII maps character to character,
    so a slice of the lowered text is the lowered slice, and words are runs and
    single marks, so once a window holds more than ``words`` of them the first
    ``words`` (the last, at the tail) end inside it, whole.  Other text is read as
    a whole (its lower case may change its length: "İ" becomes two characters)."""
    window = min(chars, _FIRST_WINDOW)
    if words < 1 or window == chars or not text.isascii():
        lowered = text.lower()
        head = _WORD.findall(lowered[:chars])[:words]
        tail = _WORD.findall(lowered[-chars:])[-words:] if len(lowered) > chars else []
        return head, tail
    found = _WORD.findall(text[:window].lower())
    if len(found) <= words:
        found = _WORD.findall(text[:chars].lower())
    head = found[:words]
    if len(text) <= chars:
        return head, []
    found = _WORD.findall(text[-window:].lower())
    if len(found) <= words:
        found = _WORD.findall(text[-chars:].lower())
    return head, found[-words:]


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message (text parts of a multi-part content)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        return ""
    return ""


def prompt_features(prompt: Prompt, endpoint: str) -> RequestFeatures:
    """The text cues of a parsed prompt (token counts are filled in later, from the
    request's descriptor): the last user message of a chat, the text of a
    completion; token-id prompts carry no words."""
    if isinstance(prompt, ChatPrompt):
        text = last_user_text(prompt.messages)
    elif isinstance(prompt, TextPrompt):
        text = prompt.text
    else:
        text = ""
    return RequestFeatures(prompt_tokens=0, endpoint=endpoint, cues=word_cues(text))


def clamp_prediction(value: float, max_tokens: int | None) -> float:
    """A prediction inside what the engine can produce: [1, max_tokens]."""
    if not math.isfinite(value):
        value = DEFAULT_OUTPUT_TOKENS
    upper = float(max_tokens) if max_tokens else math.inf
    return min(max(value, 1.0), upper)


class NoPredictor:
    """No prediction: ``max_tokens`` when set, else ``default`` (learns nothing)."""

    name = "none"

    def __init__(self, default: int = DEFAULT_OUTPUT_TOKENS) -> None:
        self.default = default

    def predict(self, features: RequestFeatures) -> float:
        return float(features.max_tokens or self.default)

    def observe(self, features: RequestFeatures, actual_output_tokens: int) -> None:
        return None


class OraclePredictor:
    """The true length (simulator only); ``fallback`` where it is unknown."""

    name = "oracle"

    def __init__(self, fallback: LengthPredictor | None = None) -> None:
        self.fallback: LengthPredictor = fallback or NoPredictor()

    def predict(self, features: RequestFeatures) -> float:
        if features.oracle_output is not None:
            return clamp_prediction(float(features.oracle_output), features.max_tokens)
        return self.fallback.predict(features)

    def observe(self, features: RequestFeatures, actual_output_tokens: int) -> None:
        self.fallback.observe(features, actual_output_tokens)


class SessionMeanPredictor:
    """The session's mean output so far; a new session gets the running mean of all
    observed outputs (``default`` before the first)."""

    name = "session-mean"

    def __init__(self, default: int = DEFAULT_OUTPUT_TOKENS) -> None:
        self.default = default
        self._total = 0.0
        self._count = 0

    def predict(self, features: RequestFeatures) -> float:
        earlier = features.earlier_outputs
        if earlier:
            guess = sum(earlier) / len(earlier)
        elif self._count:
            guess = self._total / self._count
        else:
            guess = float(self.default)
        return clamp_prediction(guess, features.max_tokens)

    def observe(self, features: RequestFeatures, actual_output_tokens: int) -> None:
        self._total += actual_output_tokens
        self._count += 1


class SessionHistory:
    """Output lengths of each session's recent turns; the least recently seen
    session is forgotten beyond ``max_sessions``, turns beyond ``turns``."""

    def __init__(self, max_sessions: int = 50_000, turns: int = HISTORY_TURNS) -> None:
        if max_sessions < 1 or turns < 1:
            raise ValueError("max_sessions and turns must be at least 1")
        self.max_sessions = max_sessions
        self.turns = turns
        self._sessions: OrderedDict[str, deque[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def earlier(self, session_key: str) -> tuple[int, ...]:
        """The session's earlier outputs, oldest first (empty for no key)."""
        found = self._sessions.get(session_key) if session_key else None
        return tuple(found) if found else ()

    def record(self, session_key: str, output_tokens: int) -> None:
        if not session_key:
            return
        turns = self._sessions.get(session_key)
        if turns is None:
            turns = self._sessions[session_key] = deque(maxlen=self.turns)
        else:
            self._sessions.move_to_end(session_key)
        turns.append(output_tokens)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
