"""Regenerate the Python stubs from ``protos/spotmorph/v1/*.proto`` (``make protos``).

Run from anywhere: ``python -m protos.generate [--out DIR]``. The import root is the repository, so
generated modules import each other as ``protos.spotmorph.v1.<name>_pb2``. Tests regenerate into a
temporary folder and compare, so checked-in stubs never drift from the sources.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "protos" / "spotmorph" / "v1"


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc  # imported here: only this command needs grpcio-tools

    bin_dir = Path(sys.executable).parent
    protos = sorted(SOURCES.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(p.relative_to(ROOT)) for p in protos],
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    return sorted((out / "protos" / "spotmorph" / "v1").glob("*_pb2*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write here instead of next to the sources")
    args = parser.parse_args()
    if args.out:
        generate(args.out)
        return 0
    tmp = ROOT / "build" / "protos"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in generate(tmp):
        shutil.copy(path, SOURCES / path.name)
        print(f"wrote {(SOURCES / path.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
