"""The built-in synthetic workloads: deterministic, and shaped as promised."""

from __future__ import annotations

import pytest

from core.tokenizer import GENERATION_PROMPT, WordTokenizer, render_chat
from sim.workloads import ApiKind, Program, ReplyOf, parse_workload
from sim.workloads.synthetic import (
    Conversations,
    ConversationsConfig,
    TreeOfThought,
    TreeOfThoughtConfig,
)
from tests.support.workloads import first


def render_all(program: Program) -> list[list[dict[str, str]]]:
    """Every step's messages, with step i's reply standing in as ``reply of i``."""
    replies = {i: f"reply of {i}" for i in range(len(program.steps))}
    return [list(step.render(replies, program.session_key).messages) for step in program.steps]


@pytest.mark.parametrize("name", ["conversations", "system-prompts", "tot"])
def test_same_seed_same_programs_and_other_seed_differs(name: str) -> None:
    once = first(parse_workload(name, seed=7), 5)
    again = first(parse_workload(name, seed=7), 5)
    other = first(parse_workload(name, seed=8), 5)
    assert once == again
    assert once != other


def test_conversation_turns_grow_history_with_the_actual_replies() -> None:
    program = next(p for p in first(Conversations(), 20) if len(p.steps) >= 3)
    rendered = render_all(program)
    for turn in range(1, len(program.steps)):
        previous, current = rendered[turn - 1], rendered[turn]
        # The whole previous prompt is a prefix, then the previous reply, then a new question.
        assert current[: len(previous)] == previous
        assert current[len(previous)] == {"role": "assistant", "content": f"reply of {turn - 1}"}
        assert current[-1]["role"] == "user"
        assert program.steps[turn].after == (turn - 1,)
    assert program.steps[0].after == ()


def test_conversation_template_keeps_the_previous_turn_as_a_prefix() -> None:
    program = next(p for p in first(Conversations(), 20) if len(p.steps) >= 2)
    rendered = render_all(program)
    assert render_chat(rendered[1]).startswith(render_chat(rendered[0])[: -len(GENERATION_PROMPT)])


def test_users_share_a_few_long_system_prompts() -> None:
    config = ConversationsConfig(system_prompts=3, system_tokens=300, users=12)
    programs = first(Conversations(config), 60)
    systems = {p.steps[0].messages[0].content for p in programs}
    users = {p.session_key for p in programs}
    assert len(systems) == 3
    assert len(users) > 3  # several users per system prompt
    for text in systems:
        assert WordTokenizer().count(str(text)) == 300


def test_user_messages_have_the_configured_token_counts() -> None:
    config = ConversationsConfig(user_tokens_min=20, user_tokens_max=20)
    tokenizer = WordTokenizer()
    for program in first(Conversations(config), 5):
        for step in program.steps:
            assert tokenizer.count(str(step.messages[-1].content)) == 20
            assert step.kind is ApiKind.CHAT


def test_system_prompts_are_single_turn_and_shared() -> None:
    programs = first(parse_workload("system-prompts:system_prompts=2,users=50"), 40)
    assert all(len(p.steps) == 1 for p in programs)
    assert len({p.steps[0].messages[0].content for p in programs}) == 2
    assert len({p.steps[0].messages[1].content for p in programs}) == 40  # unique questions


@pytest.mark.parametrize(("branching", "size"), [(2, 15), (4, 85)])
def test_tree_of_thought_size_for_depth_four(branching: int, size: int) -> None:
    tree = TreeOfThought(TreeOfThoughtConfig(branching=branching, depth=4))
    program = next(tree.programs())
    assert len(program.steps) == size == tree.config.tree_size
    assert len(program.roots()) == 1
    children: dict[int, list[int]] = {}
    for index, step in enumerate(program.steps[1:], start=1):
        children.setdefault(step.after[0], []).append(index)
    assert all(len(kids) == branching for kids in children.values())


def test_tree_children_extend_parent_prompt_and_reply_and_siblings_are_independent() -> None:
    program = next(TreeOfThought(TreeOfThoughtConfig(branching=2, depth=4)).programs())
    rendered = render_all(program)
    for index, step in enumerate(program.steps[1:], start=1):
        (parent,) = step.after
        assert rendered[index][: len(rendered[parent])] == rendered[parent]
        assert step.messages[len(rendered[parent])].content == ReplyOf(parent)
    # Siblings wait on the same parent only, so they can run concurrently.
    assert program.steps[1].after == program.steps[2].after == (0,)
    assert rendered[1][-1] != rendered[2][-1]


def test_bad_synthetic_options_are_refused() -> None:
    with pytest.raises(ValueError, match="turns"):
        ConversationsConfig(turns_min=5, turns_max=2)
