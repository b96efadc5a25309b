"""The codec reuses a msgpack Packer per thread: same bytes as packb, sane after errors."""

from __future__ import annotations

import threading

import msgpack
import pytest

from istos import codec
from istos.errors import InvalidJob

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def test_encodings_match_packb_and_survive_an_unencodable_body():
    msg = {"v": 1, "op": "claim", "workers": ["w#0", "w#1"], "body": b"\x00\x01", "x": 1.5}
    assert codec.encode_message(msg) == msgpack.packb(msg, use_bin_type=True)
    with pytest.raises(InvalidJob, match="cannot be encoded"):
        codec.encode_body({"half": "written", "then": object()}, queue="q")
    # nothing of the failed body leaks into the next encoding
    assert codec.encode_body({"n": 1}) == msgpack.packb({"n": 1}, use_bin_type=True)
    assert codec.decode_message(codec.encode_message(msg)) == msg


def test_threads_encoding_at_once_each_get_their_own_bytes():
    errors: list[str] = []
    start = threading.Barrier(4)

    def encode(k: int) -> None:
        start.wait(timeout=10)
        for i in range(2000):
            body = {"thread": k, "i": i, "pad": "x" * (k * 10)}
            if codec.decode_body(codec.encode_body(body)) != body:
                errors.append(f"thread {k} item {i}")
                return

    threads = [threading.Thread(target=encode, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
