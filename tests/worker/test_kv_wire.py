"""vLLM's KV-event wire format, decoded from recorded messages (``tests/data/kv_events``)
and from the older tagged-array form, and what the decoder keeps or refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from dynamod.errors import InvalidInputError
from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from dynamod.worker.engines.vllm_events import decode, decode_event

DATA = Path(__file__).resolve().parent.parent / "data" / "kv_events"


def recorded(name: str) -> list[bytes]:
    """The three frames of one recorded message."""
    frames = msgspec.msgpack.decode((DATA / name).read_bytes())
    assert isinstance(frames, list) and all(isinstance(f, bytes) for f in frames)
    return frames


def message(events: list[Any], seq: int = 0, ts: float = 1.5) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode([ts, events, 0])]


def test_every_recording_decodes_with_whole_blocks_and_its_sequence_number() -> None:
    files = sorted(DATA.glob("*.bin"))
    assert len(files) >= 17
    for path in files:
        seq, batch, _ = decode(recorded(path.name))
        assert seq == int(path.stem.rsplit("_", 1)[1]), path.name
        assert batch.ts > 1.7e9, "vLLM stamps a batch with its wall clock"
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert len(event.token_ids) == event.block_size * len(event.hashes)
                assert event.block_size == 32


def test_a_prompt_is_one_multi_block_event_and_decode_blocks_chain_onto_it() -> None:
    _, first, _ = decode(recorded("inproc_loop_000.bin"))
    _, second, _ = decode(recorded("inproc_loop_001.bin"))
    (prompt,) = first.events
    (decoded,) = second.events
    assert isinstance(prompt, BlockStored) and isinstance(decoded, BlockStored)
    assert len(prompt.hashes) == 4 and prompt.parent is None
    assert prompt.hashes[-1] == 16631051909519886866, "a 64-bit hash, kept exact"
    assert decoded.parent == prompt.hashes[-1]


def test_removals_stores_and_clears_keep_their_order() -> None:
    _, batch, _ = decode(recorded("serve_drain30_025.bin"))
    kinds = [type(e).__name__ for e in batch.events]
    assert kinds == ["BlockRemoved", "BlockRemoved", "BlockStored", "BlockStored"]
    assert batch.events[0] == BlockRemoved((4792888050312944436,))
    _, cleared, _ = decode(recorded("kinds_021.bin"))
    assert cleared.events == (AllBlocksCleared(),)


def test_the_older_tagged_array_form_decodes_to_the_same_events() -> None:
    stored = ["BlockStored", [7, 8], None, list(range(64)), 32, None, "GPU"]
    removed = ["BlockRemoved", [7], "GPU"]
    seq, batch, _ = decode(message([stored, removed, ["AllBlocksCleared"]], seq=9))
    assert seq == 9
    assert batch.events == (
        BlockStored((7, 8), None, tuple(range(64)), 32),
        BlockRemoved((7,)),
        AllBlocksCleared(),
    )
    as_map = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
              "token_ids": list(range(64)), "block_size": 32, "medium": "GPU"}  # fmt: skip
    assert decode_event(as_map) == decode_event(stored)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lora_id", 3),
        ("lora_name", "adapter"),
        ("extra_keys", [None, ["mm", "img", 0]]),
        ("medium", "CPU"),
        ("group_idx", 1),
    ],
)
def test_blocks_a_plain_prompt_cannot_reach_are_not_kept(field: str, value: object) -> None:
    event = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
             "token_ids": list(range(8)), "block_size": 4, field: value}  # fmt: skip
    assert decode_event(event) is None


def test_hashes_sent_as_bytes_name_blocks_as_integers() -> None:
    event = {"type": "BlockRemoved", "block_hashes": [b"\x01\x02"], "medium": None}
    assert decode_event(event) == BlockRemoved((0x0102,))


SHORT_STORED = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2, 3], "block_size": 4}


@pytest.mark.parametrize(
    ("frames", "message_part"),
    [
        ([b"kv", b"\x00" * 8], "3 frames"),
        ([b"kv", b"\x00" * 4, b""], "8 bytes"),
        ([b"kv", b"\x00" * 8, b"\xc1"], "not msgpack"),
        ([b"kv", b"\x00" * 8, msgspec.msgpack.encode({"a": 1})], "[ts, events"),
        ([b"kv", b"\x00" * 8, msgspec.msgpack.encode([float("inf"), [], 0])], "no timestamp"),
    ],
)
def test_malformed_messages_are_refused_naming_the_fault(
    frames: list[bytes], message_part: str
) -> None:
    with pytest.raises(InvalidInputError, match=message_part.replace("[", r"\[")):
        decode(frames)


GOOD = ["BlockStored", [7], None, [1, 2], 2, None, "GPU"]


@pytest.mark.parametrize(
    ("event", "message_part"),
    [
        ({"type": "BlockMoved"}, "unknown KV event type 'BlockMoved'"),
        (["BlockStored", [1], None, [1, 2], "4"], "block_size must be an integer"),
        (SHORT_STORED, "carries 3 tokens"),
        (42, "a map or a tagged array"),
        (["BlockStored", [1], None, ["1", "2"], 2], "token_ids must be integers"),
        (["BlockStored", [1], None, [1, 1 << 63], 2], "token_ids must be integers"),
        (["BlockRemoved", [b"\x01" * 65]], "at most 64 bytes"),
    ],
)
def test_a_malformed_event_is_refused_alone_and_cleared_in_its_place(
    event: object, message_part: str
) -> None:
    """The events before it stand, a clear takes its place, the ones after it follow: a
    consumer never keeps blocks that a refused removal would have taken away."""
    seq, batch, refused = decode(message([GOOD, event, event, GOOD], seq=4))
    assert seq == 4
    assert len(refused) == 2 and message_part in refused[0]
    stored = BlockStored((7,), None, (1, 2), 2)
    assert batch.events == (stored, AllBlocksCleared(), stored)
