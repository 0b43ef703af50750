"""A model's own tokenizer in dynamod: read from its files, published as a bundle, loaded
back by a daemon only when the checksum matches; and the mocker's SimpleTokenizer takes
the same path. The files are made here, offline, with the tokenizers library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from dynamod.errors import InvalidInputError
from dynamod.records import ModelCard
from dynamod.tokenizers import ChatMessage, SimpleTokenizer
from dynamod.tokenizers.bundle import (
    TokenizerRef,
    TokenizerUnavailableError,
    load,
    published,
    with_tokenizer,
)
from dynamod.tokenizers.hf import HfTokenizer

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(["hello world, the quick brown fox"] * 50, trainer=trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bpe.token_to_id("<s>"))]
    )
    directory = tmp_path_factory.mktemp("model")
    bpe.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_text_gets_the_models_special_tokens_and_a_chat_gets_them_from_the_template(
    model_dir: Path,
) -> None:
    tok = HfTokenizer.from_directory(model_dir)
    ids = tok.encode("hello world")
    assert ids[0] == 0 and tok.decode(ids) == "hello world"
    chat = [ChatMessage("user", "hello")]
    assert tok.render_chat(chat) == "<s><|user|>\nhello</s>\n<|assistant|>\n"
    chat_ids = tok.encode_chat(chat)
    assert chat_ids.count(0) == 1  # one <s>: the template's, none added again
    assert 256 < tok.vocab_size <= 300  # bytes, specials and the merges it learned


def test_the_bundle_round_trips_and_a_wrong_checksum_is_refused(model_dir: Path) -> None:
    tok = HfTokenizer.from_directory(model_dir)
    card = with_tokenizer(ModelCard("m"), tok)
    ref = TokenizerRef.of(card)
    assert ref == TokenizerRef("hf", tok.checksum) and ref.path == "/engine/tokenizer"
    again = load(published(tok), tok.checksum)
    assert again.encode("the quick brown fox") == tok.encode("the quick brown fox")
    with pytest.raises(TokenizerUnavailableError, match=r"checksum is sha256:.*model card says"):
        load(published(tok), "sha256:00")
    with pytest.raises(TokenizerUnavailableError, match="not valid JSON"):
        load(b"{", tok.checksum)


def test_the_mockers_tokenizer_takes_the_same_path() -> None:
    simple = SimpleTokenizer()
    assert TokenizerRef.of(with_tokenizer(ModelCard("m"), simple)) == TokenizerRef(
        "simple", simple.checksum
    )
    assert isinstance(load(published(simple), simple.checksum), SimpleTokenizer)
    assert TokenizerRef.of(ModelCard("m")) is None  # an older worker publishes none


def test_bad_tokenizer_files_are_refused_with_the_reason(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=r"has no tokenizer\.json"):
        HfTokenizer.from_directory(tmp_path)
    files = {"tokenizer.json": (model_dir / "tokenizer.json").read_text()}
    no_template = HfTokenizer(files)
    with pytest.raises(InvalidInputError, match="has no chat template"):
        no_template.render_chat([ChatMessage("user", "x")])
    with pytest.raises(InvalidInputError, match=r"tokenizer\.json does not load"):
        HfTokenizer({"tokenizer.json": "{}"})
    broken = {**files, "tokenizer_config.json": json.dumps({"chat_template": "{% if %}"})}
    with pytest.raises(InvalidInputError, match="chat template does not compile"):
        HfTokenizer(broken)
    refusing = {
        **files,
        "tokenizer_config.json": json.dumps(
            {"chat_template": "{{ raise_exception('only user turns') }}"}
        ),
    }
    with pytest.raises(InvalidInputError, match="refused the messages: only user turns"):
        HfTokenizer(refusing).render_chat([ChatMessage("system", "x")])
