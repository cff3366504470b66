"""The speed block's files and its rows as one table (``speed.parquet``, written by solbench.collect).

The block (solbench.speed.block) writes these files and collect reads them, so their names live here, below both.

Every row of every arm's ``speed.jsonl`` under ``results/<experiment>/speed/<block id>/``, with the block id, when
the block started, and whether its round attempt was accepted (its line in rounds.jsonl; rows of an attempt that
was rejected or never finished, a killed round, are kept with ``accepted`` False). None where no block ran.
"""

from __future__ import annotations

import json
from pathlib import Path

SPEED_DIR = "speed"
ROUNDS = "rounds.jsonl"
ROWS = "speed.jsonl"


def read_rounds(folder: Path) -> list[dict]:
    from solbench.results.storage import scan_jsonl

    return scan_jsonl(folder / ROUNDS).rows if (folder / ROUNDS).exists() else []


def speed_table(experiment_dir: str | Path):
    import pandas as pd

    from solbench.results.storage import scan_jsonl

    root = Path(experiment_dir) / SPEED_DIR
    if not root.is_dir():
        return None
    frames = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            info = json.loads((folder / "block.json").read_text()) if (folder / "block.json").is_file() else {}
        except ValueError:
            info = {}
        rounds = read_rounds(folder)
        accepted = {r["attempt"] for r in rounds if r.get("accepted")}
        load = {r["attempt"]: r.get("load") for r in rounds}
        rows = [row for arm in sorted(p for p in folder.iterdir() if (p / ROWS).is_file())
                for row in scan_jsonl(arm / ROWS).rows]
        if not rows:
            continue
        frame = pd.DataFrame(rows)
        frame["block_id"] = folder.name
        frame["started_at"] = info.get("started_at", "")
        frame["published"] = bool(info.get("published"))
        frame["accepted"] = frame["attempt"].isin(accepted)
        frame["round_load"] = frame["attempt"].map(load)
        frame["load_bound"] = (info.get("block") or {}).get("load_bound")
        block = info.get("block") or {}
        frame["target"] = block.get("target")
        frame["target_rollout"] = block.get("target_rollout")
        frames.append(frame)
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True)
