"""The generated gRPC modules are committed; they must be what the ``.proto`` generates today.

If this fails, regenerate them from the repository root (the command is in the ``.proto``
and the README) and commit the result.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path("api/grpc/hyphae/v1")
GENERATED = ("memory_pb2.py", "memory_pb2_grpc.py")


def test_the_committed_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    (tmp_path / PACKAGE).mkdir(parents=True)
    shutil.copy(ROOT / PACKAGE / "memory.proto", tmp_path / PACKAGE / "memory.proto")
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/struct.proto
    status = protoc.main(["protoc", f"-I{tmp_path}", f"-I{include}", f"--python_out={tmp_path}",
                          f"--grpc_python_out={tmp_path}", str(PACKAGE / "memory.proto")])  # fmt: skip
    assert status == 0
    for name in GENERATED:
        assert (tmp_path / PACKAGE / name).read_bytes() == (ROOT / PACKAGE / name).read_bytes(), (
            f"{PACKAGE / name} is not current: regenerate it (see memory.proto)"
        )

