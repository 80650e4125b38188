"""Channels as SageMaker delivers them: FullyReplicated, ShardedByS3Key, local, file:// and s3:// (moto)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smddp_sdk.errors import UnavailableError
from smddp_sdk.schedulers import channels
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import JobSpec


def _spec(tmp_path: Path, **fields) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", **fields})


def _trees(tmp_path: Path, count: int) -> list[OptMl]:
    return [OptMl(tmp_path / "job" / f"algo-{i + 1}") for i in range(count)]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _dataset(root: Path, count: int) -> dict[str, bytes]:
    data = {f"part-{i:03d}.csv" if i % 3 else f"sub/part-{i:03d}.csv": f"row {i}\n".encode() for i in range(count)}
    for key, body in data.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)
    return data


@given(keys=st.lists(st.text("abc/", min_size=1, max_size=6), unique=True, max_size=40), hosts=st.integers(1, 9))
def test_shards_are_disjoint_and_complete(keys: list[str], hosts: int) -> None:
    shares = [channels.shard(keys, i, hosts) for i in range(hosts)]
    assert sorted(k for share in shares for k in share) == sorted(keys)
    assert all(abs(len(a) - len(b)) <= 1 for a in shares for b in shares)  # ~1/n each


def test_shard_rule_is_round_robin_over_sorted_keys() -> None:
    assert channels.shard(["d", "a", "c", "b", "e"], 0, 2) == ["a", "c", "e"]
    assert channels.shard(["d", "a", "c", "b", "e"], 1, 2) == ["b", "d"]


@pytest.mark.parametrize("style", ["symlink", "copy"])
@pytest.mark.parametrize("uri_form", ["path", "file"])
def test_local_sharded_channel_gives_each_host_its_share(tmp_path: Path, style: str, uri_form: str) -> None:
    data = _dataset(tmp_path / "data", 7)
    source = str(tmp_path / "data") if uri_form == "path" else f"file://{tmp_path / 'data'}"
    spec = _spec(tmp_path, inputs={"train": {"s3_data": source, "distribution": "ShardedByS3Key"}})
    trees = _trees(tmp_path, 3)
    channels.deliver(spec.inputs, trees, tmp_path / "cache", style=style)
    seen = [_files(tree.channel_dir("train")) for tree in trees]
    assert all(seen), "every host got files"
    merged = {k: v for share in seen for k, v in share.items()}
    assert merged == data and sum(map(len, seen)) == len(data)
    assert sorted(seen[1]) == channels.shard(sorted(data), 1, 3)
    if style == "copy":  # a container cannot follow links to this machine's paths
        assert not any(p.is_symlink() for tree in trees for p in tree.channel_dir("train").rglob("*"))


def test_fully_replicated_local_channel_is_the_users_folder(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "data", 4)
    spec = _spec(tmp_path, inputs={"train": str(tmp_path / "data")})
    trees = _trees(tmp_path, 2)
    channels.deliver(spec.inputs, trees, tmp_path / "cache")
    for tree in trees:
        assert tree.channel_dir("train").resolve() == (tmp_path / "data").resolve()
        assert _files(tree.channel_dir("train")) == data


def test_single_file_channel_holds_only_that_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("a\n")
    (tmp_path / "data" / "other.csv").write_text("b\n")
    spec = _spec(tmp_path, inputs={"train": str(tmp_path / "data" / "a.csv")})
    trees = _trees(tmp_path, 2)
    channels.deliver(spec.inputs, trees, tmp_path / "cache", style="copy")
    assert [_files(t.channel_dir("train")) for t in trees] == [{"a.csv": b"a\n"}] * 2


def test_skip_mountable_leaves_fully_replicated_local_data_to_mounts(tmp_path: Path) -> None:
    _dataset(tmp_path / "data", 2)
    spec = _spec(tmp_path, inputs={"train": str(tmp_path / "data")})
    trees = _trees(tmp_path, 2)
    channels.deliver(spec.inputs, trees, tmp_path / "cache", style="copy", skip_mountable=True)
    assert not trees[0].channel_dir("train").exists()
    assert channels.bind_mount_source(spec.inputs["train"]) == (tmp_path / "data").resolve()


def _put(s3, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        s3.put_object(Bucket="data-bucket", Key=key, Body=body)


@pytest.mark.parametrize("distribution", ["FullyReplicated", "ShardedByS3Key"])
def test_s3_channel_is_downloaded_once_and_delivered(tmp_path: Path, s3, distribution: str) -> None:
    data = {f"train/x{i}.bin": bytes([i]) * (i + 1) for i in range(5)}
    _put(s3, {**data, "training-other/no.bin": b"not under the folder"})
    spec = _spec(tmp_path, inputs={"training": {"s3_data": "s3://data-bucket/train", "distribution": distribution}})
    trees = _trees(tmp_path, 2)
    stream = io.StringIO()
    channels.deliver(spec.inputs, trees, tmp_path / "cache", s3=s3, stream=stream)
    expected = {k.removeprefix("train/"): v for k, v in data.items()}
    assert _files(tmp_path / "cache" / "training") == expected
    seen = [_files(t.channel_dir("training")) for t in trees]
    if distribution == "FullyReplicated":
        assert seen == [expected, expected]
    else:
        assert {k: v for s in seen for k, v in s.items()} == expected and not set(seen[0]) & set(seen[1])
    assert "5/5 files" in stream.getvalue() and "\r" not in stream.getvalue()  # no TTY: one line


def test_s3_uri_naming_one_object(tmp_path: Path, s3) -> None:
    _put(s3, {"train/x.bin": b"x", "train/x.bin.bak": b"y"})
    spec = _spec(tmp_path, inputs={"training": "s3://data-bucket/train/x.bin"})
    trees = _trees(tmp_path, 1)
    channels.deliver(spec.inputs, trees, tmp_path / "cache", s3=s3, stream=io.StringIO())
    assert _files(trees[0].channel_dir("training")) == {"x.bin": b"x"}


def test_empty_s3_prefix_is_a_clear_error(tmp_path: Path, s3) -> None:
    spec = _spec(tmp_path, inputs={"training": "s3://data-bucket/nothing-here"})
    with pytest.raises(UnavailableError, match="no objects under s3://data-bucket/nothing-here"):
        channels.deliver(spec.inputs, _trees(tmp_path, 1), tmp_path / "cache", s3=s3, stream=io.StringIO())


def test_progress_rewrites_one_line_on_a_terminal(tmp_path: Path, s3) -> None:
    _put(s3, {f"d/{i}": b"x" for i in range(3)})

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    spec = _spec(tmp_path, inputs={"training": "s3://data-bucket/d"})
    channels.deliver(spec.inputs, _trees(tmp_path, 1), tmp_path / "cache", s3=s3, stream=stream)
    assert "\r" in stream.getvalue() and stream.getvalue().endswith("3/3 files, 0.0/0.0 MB\n")


def test_pipe_is_refused_and_fastfile_is_noted(tmp_path: Path) -> None:
    _dataset(tmp_path / "data", 1)
    pipe = _spec(tmp_path, input_mode="Pipe", inputs={"train": str(tmp_path / "data")})
    [issue] = channels.issues(pipe)
    assert issue.path == "input_mode" and "Pipe mode" in issue.message
    fast = _spec(tmp_path, inputs={"train": {"s3_data": str(tmp_path / "data"), "input_mode": "FastFile", "distribution": "ShardedByS3Key"}})
    assert channels.issues(fast) == []
    notes = channels.notes(fast, 2)
    assert any("FastFile runs as File" in n for n in notes) and any("ShardedByS3Key" in n for n in notes)


def test_manifest_channels_are_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, inputs={"train": {"s3_data": "s3://b/manifest", "s3_data_type": "ManifestFile"}})
    assert [i.path for i in channels.issues(spec)] == ["inputs.train.s3_data_type"]
