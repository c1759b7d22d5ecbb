"""Run by the restart test in a fresh process: serve the prompts, print outputs as JSON, exit.

python -m tests.e2e_offload.serve_once MODEL_DIR DISK_PATH
python -m tests.e2e_offload.serve_once MODEL_DIR valkey://HOST:PORT   (a remote tier instead)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.e2e_offload.helpers import PROMPTS, generate, make_llm, offload
from tests.support.stats import flat_counters


def main() -> None:
    model, where = Path(sys.argv[1]), sys.argv[2]
    remote = where.startswith("valkey://")
    # a loaded test machine can starve valkey-server past the default 2 s per command
    config = (
        offload(remote=where, remote_timeout_seconds=30) if remote else offload(disk=Path(where))
    )
    llm = make_llm(model, config)
    outs = generate(llm, PROMPTS[:2])
    result = {
        "token_ids": [o.token_ids for o in outs],
        "cached": [o.cached_tokens for o in outs],
        "counters": flat_counters(llm.engine.stats().transfer.connector),
    }
    llm.engine.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
