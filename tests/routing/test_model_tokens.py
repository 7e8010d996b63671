"""Per-model tokenizer files read from disk, fallback reporting, large prompts off the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from core.model_tokenizer import TokenizerFilesError
from core.prompts import ChatPrompt, FallbackEncoder, TextPrompt
from ops.bench.model_fixture import BOS, write_model_tokenizer
from routing.model_tokens import ModelEncoders, read_tokenizer_files


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_tokenizer(tmp_path_factory.mktemp("tiny-model"))


def test_a_directory_or_a_tokenizer_json_path_is_read(model_dir: Path) -> None:
    from_dir = read_tokenizer_files(str(model_dir))
    from_file = read_tokenizer_files(str(model_dir / "tokenizer.json"))
    assert from_dir.tokenizer_json == from_file.tokenizer_json
    assert from_dir.config == from_file.config and from_dir.config["bos_token"] == BOS
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    try:
        assert read_tokenizer_files(str(model_dir)).chat_template == "{{ messages[0]['content'] }}"
    finally:
        (model_dir / "chat_template.jinja").unlink()


def test_a_missing_tokenizer_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(TokenizerFilesError, match=r"no tokenizer\.json"):
        ModelEncoders({"m": str(tmp_path)})


def test_each_model_reports_where_its_tokens_come_from(model_dir: Path) -> None:
    encoders = ModelEncoders({"tiny": str(model_dir)})
    own = encoders.for_model("tiny")
    assert own.tokenizer_source == f"{model_dir} (tokenizer.json)"
    assert own.template_source == f"{model_dir} (tokenizer_config.json)"
    other = encoders.for_model("anything-else")
    assert (other.tokenizer_source, other.template_source) == ("fallback", "fallback")


class ThreadRecorder(FallbackEncoder):
    """The fallback encoder, noting which thread tokenized."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]:
        self.threads.append(threading.get_ident())
        return super().encode(text, add_special_tokens=add_special_tokens)


def test_large_prompts_are_tokenized_off_the_event_loop_small_ones_inline() -> None:
    encoders = ModelEncoders({}, thread_chars=1000)
    recorder = ThreadRecorder()
    encoders.fallback = recorder
    small = ChatPrompt([{"role": "user", "content": "x " * 100}])
    large = TextPrompt(" word" * 1000)

    async def tokenize_both() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        small_tokens = await encoders.tokens("m", small)
        large_tokens = await encoders.tokens("m", large)
        return loop_thread, len(small_tokens), len(large_tokens)

    loop_thread, n_small, n_large = asyncio.run(tokenize_both())
    assert (n_small > 100, n_large) == (True, 1000)
    assert recorder.threads[0] == loop_thread
    assert recorder.threads[1] != loop_thread
