"""kvmux ls | stats | verify | purge against real disk tiers written through the codec."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmux import codec
from kvmux.cli import main
from kvmux.config import DiskSpec, RedisSpec
from kvmux.errors import ConfigError
from kvmux.stores import DictStore, DiskStore
from kvmux.tier.scheduler.generation import encode_record, new_generation
from kvmux.tools.ops import (
    Progress,
    Scan,
    Selection,
    check,
    describe_tier,
    format_age,
    format_size,
    parse_duration,
    peek,
    tier_spec,
)
from tests.support.mutate import mutate, random_bytes
from tests.support.tier_entries import reframe, signing_keys, write_model

DAY = 86400.0


@pytest.fixture
def tier(tmp_path: Path) -> DiskStore:
    return DiskStore(tmp_path / "tier", 1 << 30)


def _path(store: DiskStore, key: bytes) -> Path:
    return store.root / key.hex()[:2] / f"{key.hex()}.kvx"


def _age(store: DiskStore, key: bytes, seconds: float) -> None:
    stamp = time.time() - seconds
    os.utime(_path(store, key), (stamp, stamp))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def _doc(text: str) -> dict[str, object]:
    (line,) = text.splitlines()
    document = json.loads(line)
    assert isinstance(document, dict)
    return document


def _keys_on_disk(store: DiskStore) -> set[str]:
    return {p.name.removesuffix(".kvx") for p in store.root.glob("*/*.kvx")}


# -- ls --------------------------------------------------------------------------


def test_ls_lists_every_entry_with_its_header_fields(tier, capsys) -> None:
    llama = write_model(tier, "llama", 4)
    qwen = write_model(tier, "qwen", 2, signing_keys("k1"))
    code, out, err = _run(capsys, "ls", "--disk", str(tier.root), "--json")
    assert code == 0 and err == ""
    rows = {row["key"]: row for row in _lines(out)}
    assert set(rows) == {k.hex() for k in llama.keys + qwen.keys}
    for key in llama.keys:
        row = rows[key.hex()]
        assert row["namespace"] == llama.namespace.hex()
        assert row["size"] == len(llama.values[key])
        assert row["signed"] is False and row["kid"] is None and row["layers"] == 2
        assert isinstance(row["age"], float) and 0 <= row["age"] < 60
    assert {rows[k.hex()]["kid"] for k in qwen.keys} == {"k1"}


def test_ls_table_and_limit(tier, capsys) -> None:
    written = write_model(tier, "llama", 5)
    _age(tier, written.keys[0], 3 * DAY + 7200)
    code, out, _ = _run(capsys, "ls", "--disk", str(tier.root))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["KEY", "NAMESPACE", "SIZE", "AGE", "SIGNED"]
    assert len(lines) == 6
    old = next(line for line in lines if line.startswith(written.keys[0].hex()))
    size = format_size(len(written.values[written.keys[0]]))
    assert old.split()[1:] == [written.namespace.hex(), *size.split(), "3d02h", "-"]
    _, out, _ = _run(capsys, "ls", "--disk", str(tier.root), "--limit", "2", "--json")
    assert len(_lines(out)) == 2


def test_ls_filters_by_namespace_prefix_and_age(tier, capsys) -> None:
    llama, qwen = write_model(tier, "llama", 3), write_model(tier, "qwen", 3)
    _age(tier, qwen.keys[1], 8 * DAY)
    root = str(tier.root)
    _, out, _ = _run(capsys, "ls", "--disk", root, "--json", "--namespace", llama.namespace.hex())
    assert {row["key"] for row in _lines(out)} == {k.hex() for k in llama.keys}
    prefix = qwen.namespace.hex()[:8]
    _, out, _ = _run(capsys, "ls", "--disk", root, "--json", "--namespace", prefix)
    assert {row["key"] for row in _lines(out)} == {k.hex() for k in qwen.keys}
    _, out, _ = _run(capsys, "ls", "--disk", root, "--json", "--older-than", "7d")
    assert [row["key"] for row in _lines(out)] == [qwen.keys[1].hex()]


def test_reads_leave_recency_alone(tier, capsys) -> None:
    written = write_model(tier, "llama", 3)
    for key in written.keys:
        _age(tier, key, DAY)
    before = {k: _path(tier, k).stat().st_mtime for k in written.keys}
    for command in ("ls", "stats", "verify"):
        assert _run(capsys, command, "--disk", str(tier.root))[0] == 0
    assert {k: _path(tier, k).stat().st_mtime for k in written.keys} == before


# -- stats -----------------------------------------------------------------------


def test_stats_per_namespace(tier, capsys) -> None:
    llama, qwen = write_model(tier, "llama", 4), write_model(tier, "qwen", 2)
    _age(tier, llama.keys[0], 2 * DAY)
    code, out, _ = _run(capsys, "stats", "--disk", str(tier.root), "--json")
    document = _doc(out)
    assert code == 0 and document["entries"] == 6 and document["verified"] is False
    assert document["bytes"] == sum(map(len, [*llama.values.values(), *qwen.values.values()]))
    first, second = document["namespaces"]
    assert first["namespace"] == llama.namespace.hex() and first["entries"] == 4
    assert first["oldest"] >= 2 * DAY > first["newest"]
    assert second["namespace"] == qwen.namespace.hex() and second["entries"] == 2
    assert "bad" not in first
    code, out, _ = _run(capsys, "stats", "--disk", str(tier.root))
    lines = out.splitlines()
    assert lines[0] == f"disk tier 'disk' at {tier.root}"
    assert lines[1].split() == ["NAMESPACE", "ENTRIES", "BYTES", "OLDEST", "NEWEST"]
    assert lines[2].split()[:2] == [llama.namespace.hex(), "4"]
    assert lines[-1].split()[:2] == ["total", "6"]


def test_stats_verify_counts_bad_entries(tier, capsys) -> None:
    written = write_model(tier, "llama", 3)
    path = _path(tier, written.keys[0])
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    code, out, _ = _run(capsys, "stats", "--disk", str(tier.root), "--verify", "--json")
    document = _doc(out)
    assert code == 0 and document["verified"] is True and document["bad"] == 1
    assert document["namespaces"][0]["bad"] == 1


# -- verify ----------------------------------------------------------------------


def _spoil(tier: DiskStore) -> dict[str, str]:
    """Plant every kind of bad entry; returns the expected status by hex key."""
    written = write_model(tier, "llama", 6)
    keys = written.keys
    flipped = bytearray(written.values[keys[0]])
    flipped[-20] ^= 1
    _path(tier, keys[0]).write_bytes(bytes(flipped))
    _path(tier, keys[1]).write_bytes(written.values[keys[1]][:100])
    _path(tier, keys[2]).write_bytes(written.values[keys[3]])  # another key's entry
    garbage = bytes(range(16))
    _path(tier, garbage).parent.mkdir(exist_ok=True)
    _path(tier, garbage).write_bytes(b"not an entry at all")
    (tier.root / "zz").mkdir()
    (tier.root / "zz" / "notakey.kvx").write_bytes(b"ignored: no key names it")
    return {key.hex(): "corrupt" for key in [*keys[:3], garbage]}


def test_verify_reports_bad_entries_and_exits_3(tier, capsys) -> None:
    expected = _spoil(tier)
    code, out, _ = _run(capsys, "verify", "--disk", str(tier.root), "--json")
    document = _doc(out)
    assert code == 3
    assert {p["key"]: p["status"] for p in document["problems"]} == expected
    assert document["counts"] == {"ok": 3, "corrupt": 4} and document["bad"] == 4
    reasons = {p["key"]: p["reason"] for p in document["problems"]}
    assert "stored under another key" in " ".join(reasons.values())
    assert not any(p["removed"] for p in document["problems"])
    assert len(_keys_on_disk(tier)) == 8  # nothing removed without --delete
    code, out, _ = _run(capsys, "verify", "--disk", str(tier.root))
    assert code == 3
    assert "checked 7 entries" in out and "4 bad entries: remove with --delete" in out


def test_verify_delete_removes_only_bad_entries(tier, capsys) -> None:
    expected = _spoil(tier)
    good = _keys_on_disk(tier) - set(expected) - {"notakey"}
    code, out, _ = _run(capsys, "verify", "--disk", str(tier.root), "--delete")
    assert code == 3 and "removed 4 bad entries" in out
    assert _keys_on_disk(tier) == good | {"notakey"}
    assert _run(capsys, "verify", "--disk", str(tier.root))[0] == 0


def test_verify_oversized_entries_are_never_read(tier, capsys) -> None:
    written = write_model(tier, "llama", 2)
    spec = json.dumps({"type": "disk", "path": str(tier.root), "capacity": 1000})
    code, out, _ = _run(capsys, "verify", "--store", spec, "--json")
    statuses = {p["key"]: p["status"] for p in _doc(out)["problems"]}
    assert code == 3 and statuses == {k.hex(): "oversized" for k in written.keys}


def test_verify_signatures_with_the_tiers_keys(tier, tmp_path, capsys) -> None:
    keys = signing_keys("new", "old", seed=1)
    signed = write_model(tier, "llama", 2, keys)
    rotated_out = write_model(tier, "qwen", 1, signing_keys("retired", seed=2))
    plain = write_model(tier, "mistral", 1)
    victim = signed.keys[0]  # a forger without the secret: same kid, MAC from another key
    forged = codec.encode(signed.namespace, victim, [], [], signing_keys("new", seed=9))
    _path(tier, victim).write_bytes(forged)
    key_file = tmp_path / "keys"
    secrets = random.Random(1)  # the secrets signing_keys("new", "old", seed=1) drew
    key_file.write_text("".join(f"{kid}:{secrets.randbytes(16).hex()}\n" for kid in ("new", "old")))
    root = str(tier.root)
    code, out, _ = _run(
        capsys, "verify", "--disk", root, "--signing-key-file", str(key_file), "--json"
    )
    statuses = {p["key"]: p["status"] for p in _doc(out)["problems"]}
    assert statuses == {
        victim.hex(): "forged",
        rotated_out.keys[0].hex(): "unknown-key",
        plain.keys[0].hex(): "unsigned",
    }
    assert code == 3 and _doc(out)["counts"]["ok"] == 1
    argv = ["verify", "--disk", root, "--signing-key-file", str(key_file), "--delete"]
    assert _run(capsys, *argv)[0] == 3
    assert _keys_on_disk(tier) == {
        signed.keys[1].hex(),
        rotated_out.keys[0].hex(),
        plain.keys[0].hex(),
    }
    assert _run(capsys, *argv)[0] == 0  # unsigned and unknown-key are not bad without --strict
    assert _run(capsys, *argv, "--strict")[0] == 3
    assert _keys_on_disk(tier) == {signed.keys[1].hex()}


def test_verify_without_keys_checks_checksums_and_says_so(tier, capsys) -> None:
    write_model(tier, "llama", 2, signing_keys("k1"))
    code, out, _ = _run(capsys, "verify", "--disk", str(tier.root))
    assert code == 0
    assert "2 signed entries: checksums checked, signatures not" in out


def test_signing_keys_in_the_store_spec(tier, tmp_path, capsys, monkeypatch) -> None:
    keys = signing_keys("k1", seed=4)
    write_model(tier, "llama", 2, keys)
    monkeypatch.setenv("TIER_KEYS", f"k1:{random.Random(4).randbytes(16).hex()}")
    spec = {"type": "disk", "path": str(tier.root), "capacity": "1GiB"}
    spec["signing"] = {"key_env": "TIER_KEYS"}
    code, out, _ = _run(capsys, "verify", "--store", json.dumps(spec), "--json")
    assert code == 0 and _doc(out)["counts"] == {"ok": 2}
    code, _, err = _run(
        capsys, "verify", "--store", json.dumps(spec), "--signing-key-env", "TIER_KEYS"
    )
    assert code == 1 and "'store.signing'" in err


# -- purge -----------------------------------------------------------------------


def test_purge_all(tier, capsys) -> None:
    write_model(tier, "llama", 3)
    write_model(tier, "qwen", 2)
    record = encode_record(new_generation(), None)
    tier.write_generation(record)
    code, out, _ = _run(capsys, "purge", "--disk", str(tier.root), "--all", "--json")
    document = _doc(out)
    assert code == 0 and document["removed"] == 5 and document["entries"] == 5
    assert [n["entries"] for n in document["namespaces"]] == [3, 2]
    assert _keys_on_disk(tier) == set() and tier.read_generation() == record  # the generation stays


def test_purge_by_namespace(tier, capsys) -> None:
    llama, qwen = write_model(tier, "llama", 3), write_model(tier, "qwen", 2)
    code, out, _ = _run(
        capsys, "purge", "--disk", str(tier.root), "--namespace", qwen.namespace.hex()
    )
    assert code == 0 and "removed 2 entries" in out and qwen.namespace.hex() in out
    assert _keys_on_disk(tier) == {k.hex() for k in llama.keys}


def test_purge_by_age_and_dry_run(tier, capsys) -> None:
    written = write_model(tier, "llama", 4)
    for key in written.keys[:2]:
        _age(tier, key, 10 * DAY)
    argv = ["purge", "--disk", str(tier.root), "--older-than", "1w"]
    code, out, _ = _run(capsys, *argv, "--dry-run")
    assert code == 0 and "would remove 2 entries" in out and "dry run: nothing removed" in out
    assert len(_keys_on_disk(tier)) == 4
    code, out, _ = _run(capsys, *argv, "--json")
    document = _doc(out)
    assert document["removed"] == 2 and document["dry_run"] is False
    assert _keys_on_disk(tier) == {k.hex() for k in written.keys[2:]}


def test_purge_combines_namespace_and_age(tier, capsys) -> None:
    llama, qwen = write_model(tier, "llama", 2), write_model(tier, "qwen", 2)
    for key in llama.keys + qwen.keys[:1]:
        _age(tier, key, 2 * DAY)
    argv = ["purge", "--disk", str(tier.root), "--older-than", "1d"]
    assert _run(capsys, *argv, "--namespace", qwen.namespace.hex())[0] == 0
    assert _keys_on_disk(tier) == {k.hex() for k in llama.keys + qwen.keys[1:]}


def test_purge_keeps_entries_whose_namespace_cannot_be_read(tier, capsys) -> None:
    written = write_model(tier, "llama", 2)
    _path(tier, written.keys[0]).write_bytes(b"garbage")
    argv = ["purge", "--disk", str(tier.root), "--namespace", written.namespace.hex()]
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and "passed over: 1 whose header cannot be read" in out
    assert _keys_on_disk(tier) == {written.keys[0].hex()}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "'purge': say what to remove"),
        (["--all", "--older-than", "1d"], "'--all': removes every entry"),
        (["--older-than", "soon"], "'--older-than': bad duration 'soon'"),
        (["--namespace", "abc"], "'--namespace': bad namespace id 'abc'"),
    ],
)
def test_purge_needs_a_clear_selection(tier, capsys, extra, message) -> None:
    write_model(tier, "llama", 2)
    code, out, err = _run(capsys, "purge", "--disk", str(tier.root), *extra)
    assert code == 1 and out == "" and message in err
    assert len(_keys_on_disk(tier)) == 2


# -- naming the tier -------------------------------------------------------------


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("{not json", "'store': not JSON"),
        ('["disk"]', "'store': expected a mapping"),
        ('{"type": "disk", "path": "/x", "capacity": "1GiB", "colour": 1}', "'store.colour'"),
        ('{"type": "memory", "capacity": "1GiB"}', "'store.type': a memory tier"),
        ('{"type": "tape"}', "'store.type': unknown store type"),
    ],
)
def test_store_spec_errors_name_the_key(capsys, store, message) -> None:
    code, _, err = _run(capsys, "ls", "--store", store)
    assert code == 1 and message in err


def test_a_missing_directory_is_not_created(tmp_path, capsys) -> None:
    code, _, err = _run(capsys, "ls", "--disk", str(tmp_path / "nowhere"))
    assert code == 1 and "no such directory" in err and not (tmp_path / "nowhere").exists()


def test_exactly_one_tier(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["ls", "--disk", str(tmp_path), "--redis", "redis://localhost"])
    assert exit_info.value.code == 2
    with pytest.raises(ConfigError, match="exactly one"):
        tier_spec()


def test_tier_descriptions_hide_passwords(tmp_path) -> None:
    spec = tier_spec(redis="redis://vllm:s3cret@kv.internal:6379/0")
    assert isinstance(spec, RedisSpec)
    assert describe_tier(spec) == {
        "type": "redis",
        "name": "redis",
        "location": "redis://vllm@kv.internal:6379/0 kvmux:",
    }
    disk = tier_spec(disk=str(tmp_path))
    assert isinstance(disk, DiskSpec) and disk.capacity == 1 << 30


# -- garbage and the header parse --------------------------------------------------


def _fuzz_seed() -> bytes:
    store = DictStore(1 << 20)
    written = write_model(store, "fuzz", 1, signing_keys("k1"))
    return written.values[written.keys[0]]


def test_header_parse_and_check_never_raise_on_garbage() -> None:
    rng = random.Random(7)
    seed, keys = _fuzz_seed(), signing_keys("k1")
    key = bytes.fromhex(json.loads(seed[12 : 12 + int.from_bytes(seed[8:12], "little")])["key"])
    inputs = [mutate(rng, seed) for _ in range(4000)] + [
        random_bytes(rng, 300) for _ in range(1000)
    ]
    odd = [[], {}, "x" * 200, 2**70, -1, 1.5, None, True, "zz", "ab" * 100]
    for field in ("ns", "key", "kid", "layers", "payload_len"):
        inputs += [reframe(seed, **{field: value}) for value in odd]
    inputs += [seed[:12] + b"[" * 5000, seed[:8] + (2**31).to_bytes(4, "little")]
    for data in inputs:
        header = peek(data)
        status, _ = check(data, key, header, keys)
        assert status in {"ok", "corrupt", "forged", "unsigned", "unknown-key"}
    assert peek(seed) is not None and check(seed, key, peek(seed), keys) == ("ok", "")


def test_garbage_tier_is_reported_not_a_crash(tier, capsys) -> None:
    rng = random.Random(3)
    seed = _fuzz_seed()
    for i in range(200):
        key = rng.randbytes(16)
        _path(tier, key).parent.mkdir(exist_ok=True)
        data = mutate(rng, seed) if i % 2 else random_bytes(rng, 500)
        _path(tier, key).write_bytes(data)
    for command in ("ls", "stats"):
        assert _run(capsys, command, "--disk", str(tier.root), "--json")[0] == 0
    code, out, _ = _run(capsys, "verify", "--disk", str(tier.root), "--json", "--delete")
    assert code == 3 and _doc(out)["bad"] == _doc(out)["removed"] > 190


def test_headers_longer_than_the_first_read(tier, capsys) -> None:
    layers = tuple(codec.LayerSpec((1, 1), "uint8") for _ in range(2000))  # a 30 KiB header
    written = write_model(tier, "many-layers", 1, layers=layers)
    _, out, _ = _run(capsys, "ls", "--disk", str(tier.root), "--json")
    (row,) = _lines(out)
    assert row["layers"] == 2000 and row["namespace"] == written.namespace.hex()


# -- units and progress ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("12h", 43200),
        ("7d", 7 * DAY),
        ("1w", 7 * DAY),
        ("1d12h", 1.5 * DAY),
        ("0.5h", 1800),
    ],
)
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "1d-2h", "7 days"])
def test_parse_duration_refuses(text) -> None:
    with pytest.raises(ConfigError, match="--older-than"):
        parse_duration(text)


def test_formats() -> None:
    assert [format_size(n) for n in (0, 1023, 2048, 3 << 20, 5 << 40)] == [
        "0 B",
        "1023 B",
        "2.0 KiB",
        "3.0 MiB",
        "5.0 TiB",
    ]
    assert [format_age(a) for a in (None, 5.9, 600, 3 * 3600 + 300, 4 * DAY + 3 * 3600)] == [
        "-",
        "5s",
        "10m",
        "3h05m",
        "4d03h",
    ]


def test_progress_bar_on_a_known_total(tier) -> None:
    written = write_model(tier, "llama", 10)
    size = format_size(sum(map(len, written.values.values())))
    stream = io.StringIO()
    progress = Progress("verify", stream=stream, enabled=True, interval=0)
    records = list(Scan(tier, Selection(), progress, verify=True))
    assert len(records) == 10
    last = stream.getvalue().split("\r")[-1]
    assert last.startswith(f"verify [{'#' * 24}] 100% 10/10 entries {size} ")
    assert last.endswith("/s\x1b[K\n")


def test_progress_stays_off_unless_asked(tier, capsys) -> None:
    write_model(tier, "llama", 2)
    quiet = Progress("ls", stream=io.StringIO())  # not a terminal: off
    assert quiet.enabled is False
    _, _, err = _run(capsys, "ls", "--disk", str(tier.root), "--json", "--quiet")
    assert err == ""


# -- the command line -------------------------------------------------------------


def test_console_entry_runs_without_vllm_or_torch(tier) -> None:
    write_model(tier, "llama", 2)
    script = (
        "import sys; from kvmux.cli import main; code = main(sys.argv[1:]); "
        "assert not {'torch', 'vllm'} & set(sys.modules), 'imported torch or vllm'; sys.exit(code)"
    )
    argv = [sys.executable, "-c", script, "stats", "--disk", str(tier.root), "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == 2
    module = [sys.executable, "-m", "kvmux.cli", "verify", "--disk", str(tier.root), "--quiet"]
    assert subprocess.run(module, capture_output=True, timeout=60, check=False).returncode == 0


def test_a_closed_pipe_ends_quietly(tier) -> None:
    write_model(tier, "llama", 2000)  # more output than a pipe buffers
    argv = [sys.executable, "-m", "kvmux.cli", "ls", "--disk", str(tier.root)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"KEY")
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""
