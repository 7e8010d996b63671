"""Programs: rendering replies into requests and refusing impossible dependencies."""

from __future__ import annotations

import pytest

from sim.workloads import ApiKind, Message, Program, ReplyOf, Step


def test_render_puts_the_reply_into_the_follow_up() -> None:
    step = Step(
        kind=ApiKind.CHAT,
        max_tokens=8,
        messages=(Message("user", "hi"), Message("assistant", ReplyOf(0)), Message("user", "and?")),
        after=(0,),
    )
    request = step.render({0: "hello back"}, "user-1")
    assert request.messages[1] == {"role": "assistant", "content": "hello back"}
    assert request.session_key == "user-1"


def test_a_step_cannot_quote_a_reply_it_does_not_wait_for() -> None:
    first = Step(kind=ApiKind.CHAT, max_tokens=4, messages=(Message("user", "a"),))
    second = Step(kind=ApiKind.CHAT, max_tokens=4, messages=(Message("assistant", ReplyOf(0)),))
    with pytest.raises(ValueError, match="without waiting"):
        Program(program_id=0, session_key="", steps=(first, second))


def test_a_step_cannot_wait_for_a_later_step() -> None:
    step = Step(kind=ApiKind.COMPLETION, max_tokens=4, prompt="x", after=(1,))
    with pytest.raises(ValueError, match="not before it"):
        Program(program_id=0, session_key="", steps=(step, step))
