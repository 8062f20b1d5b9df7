"""Chapter 05's character-level language model (the regime of Ba et al.'s and Cooijmans et
al.'s claims) for 300 steps and ten seeds, once, outside the notebook (which cannot afford it).

    PYTHONPATH=src python benchmarks/char_lm.py
    PYTHONPATH=src python benchmarks/char_lm.py --steps 4 --seeds 2 --out /tmp/x   # a smoke run

Three arms, ``lnbook.rnn.CharLSTM(vocab, 64, norm, embed_size=16, max_steps=64)`` with norm
"none" (LSTM), "layer" (LN-LSTM) and "batch" (BN-LSTM), each ONE stacked job of every seed at
every rate (``lnbook.cell_study.grid``; rates 3e-3, 1e-2, 3e-2), trained by
``lnbook.seeds.fit_lm`` on ``lnbook.data.char_corpus()``'s training split: Adam, windows of 64
characters, batches of 16, gradients clipped to norm 1.0, one CPU thread. The first half of the
corpus's validation split is the validation split (it chooses the rate), the second half the
test split. It writes, with provenance (machine, commit, date, command, versions) as leading
``#`` lines:

- ``char_lm-curves.csv``: arm, lr, seed, step, val_loss: the validation loss (nats per
  character, 4 fixed batches of 32 windows; BatchNorm with its moving averages) every
  ``--every`` steps;
- ``char_lm-final.csv``: arm, lr, seed, val_loss, test_loss after the last step (8 fixed batches
  of 32 windows each), and for the BN-LSTM also val_loss_population, test_loss_population: the
  same windows scored with Cooijmans et al.'s population statistics over 256 fixed training
  windows (``lnbook.rnn.lm_loss_population``); empty for the other arms. A diverged member's
  losses are ``nan``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from sigmoid_full import add_step_arguments, check_step_arguments, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import cell_study, data, rnn, seeds, train

ARMS = {"LSTM": "none", "LN-LSTM": "layer", "BN-LSTM": "batch"}
HIDDEN, EMBED, BLOCK, BATCH = 64, 16, 64, 16
SCORE_BATCHES, POP_WINDOWS = 8, 256  # final scores: 8 fixed batches of 32 windows; population: 256 windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-3, 1e-2, 3e-2])
    add_step_arguments(parser, every=50)
    args = parser.parse_args()
    check_step_arguments(parser, args)
    torch.set_num_threads(1)
    corpus = data.char_corpus()
    half = len(corpus.val) // 2
    val_ids, test_ids = corpus.val[:half], corpus.val[half:]
    head = provenance(f"arms: {', '.join(f'{a} (norm {n!r})' for a, n in ARMS.items())}; lr {args.lrs}; "
                      f"seeds 0-{args.seeds - 1}; {args.steps} steps of batches of {BATCH} windows of {BLOCK}; "
                      f"hidden {HIDDEN}, embedding {EMBED}; Adam, grad clip 1.0; corpus {len(corpus.train)} train, "
                      f"{half} validation, {len(test_ids)} test characters (python {sys.version.split()[0]}'s pydoc topics)")
    member_seeds, member_lrs = cell_study.grid(args.lrs, range(args.seeds))
    curves = ["arm,lr,seed,step,val_loss"]
    final = ["arm,lr,seed,val_loss,test_loss,val_loss_population,test_loss_population"]
    for arm, norm in ARMS.items():
        start = time.perf_counter()
        out = seeds.runs(lambda: rnn.CharLSTM(corpus.vocab_size, HIDDEN, norm, embed_size=EMBED, max_steps=BLOCK),
                         member_seeds, fit=seeds.fit_lm, train_ids=corpus.train, val_ids=val_ids, steps=args.steps,
                         lr=member_lrs, batch_size=BATCH, block_size=BLOCK, eval_every=args.every, grad_clip=1.0)
        trained = time.perf_counter() - start
        for (model, hist), lr, s in zip(out, member_lrs, member_seeds):
            curves += [f"{arm},{lr},{s},{step},{loss:.6f}" for step, loss in zip(hist.val_steps, hist.val_loss)]
            scores = [math.nan] * (4 if norm == "batch" else 2)
            if not hist.diverged:
                scores = [train.lm_loss(model, ids, BLOCK, batches=SCORE_BATCHES) for ids in (val_ids, test_ids)]
                if norm == "batch":
                    scores += [rnn.lm_loss_population(model, corpus.train, ids, BLOCK, n_windows=POP_WINDOWS,
                                                      batches=SCORE_BATCHES) for ids in (val_ids, test_ids)]
            final.append(f"{arm},{lr},{s}," + ",".join(f"{v:.6f}" for v in scores) + ("" if norm == "batch" else ",,"))
        print(f"{arm}: {len(out)} members, {args.steps} steps in {trained:.0f} s, scored in "
              f"{time.perf_counter() - start - trained:.0f} s; diverged: {sum(h.diverged for _, h in out)}", flush=True)
    write_tables(args.out, head, {"char_lm-curves.csv": curves, "char_lm-final.csv": final})


if __name__ == "__main__":
    main()
