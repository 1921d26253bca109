"""``spotmorph data prepare TEXT... --out FILE.bin [--tokenizer byte|PATH] [--eos TOKEN]``: token files.

The output is what ``spotmorph.data.TokenFileDataset`` reads (see ``worker_agent.runtime.model.data``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND", parser_class=type(parser))
    sub.required = True
    prepare = sub.add_parser(
        "prepare",
        help="tokenize text files into a token file (FILE.bin and FILE.bin.json)",
        description="Tokenize text files (one document each, in order) into a memory-mappable token file.",
    )
    prepare.add_argument("texts", nargs="+", type=Path, metavar="TEXT_FILE", help="text files, one document each")
    prepare.add_argument("--out", type=Path, required=True, help="the .bin file to write (its sidecar is FILE.json)")
    prepare.add_argument(
        "--tokenizer",
        default="byte",
        help="'byte' (built in: bytes are tokens, 256 ends a document) or the path of a tokenizers JSON file",
    )
    prepare.add_argument("--eos", help="token appended after each document (tokenizers JSON only), e.g. '</s>'")


def run(args: argparse.Namespace) -> int:
    from worker_agent.runtime.model.data import prepare_token_file

    meta = prepare_token_file(args.texts, args.out, args.tokenizer, args.eos)
    print(
        f"wrote {args.out}: {meta['tokens']} tokens ({meta['dtype']}, vocabulary {meta['vocab_size']}, "
        f"tokenizer {meta['tokenizer']}) from {len(args.texts)} file(s)",
        file=sys.stderr,
    )
    return 0
