"""Train the offline BPE of a local corpus once, without building a model, so that runs started side by side find it
cached instead of each training the same one (docs/gpu_runbook.md: the GPU call trains it once for its parallel runs).

    python scripts/train_bpe.py data/code.jsonl [--vocab_size 8192] [--data_dir data]

It is the tokenizer `torchrun_main.py --dataset <corpus>` would train (the same training split, vocabulary and cache
file, `<data_dir>/tokenizers/bpe<vocab>-<fingerprint>.json`); one already there is reused.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from galore_plumage.training import parse_config  # noqa: E402
from galore_plumage.training.data import load_texts  # noqa: E402
from galore_plumage.training.tokenizer import load_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="a local .txt or .jsonl corpus, as torchrun_main.py's --dataset")
    parser.add_argument("--vocab_size", default="8192")
    parser.add_argument("--data_dir", default="data", help="where tokenizers are cached (torchrun_main.py's --data_dir)")
    args = parser.parse_args(argv)
    start = time.time()
    config = parse_config(["--dataset", args.corpus, "--vocab_size", args.vocab_size, "--data_dir", args.data_dir])
    load_tokenizer(config.tokenizer, load_texts(config)[0], config.vocab_size, config.data_dir, config.max_length)
    print(f"BPE of {args.corpus} ready in {time.time() - start:.1f} s (cached under {args.data_dir}/tokenizers)",
          flush=True)


if __name__ == "__main__":
    main()
