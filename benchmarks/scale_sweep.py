"""Chapter 07's training runs, five seeds each, once, outside the notebook (which cannot afford
them in its 180 s).

    PYTHONPATH=src python benchmarks/scale_sweep.py        # or: make scale-sweep
    PYTHONPATH=src python benchmarks/scale_sweep.py --steps 4 --every 2 --seeds 2 --out /tmp/x   # a smoke run

Every arm is a ``lnbook.transformer.TinyGPT`` on windows of 32 characters of
``lnbook.data.char_corpus()``, trained by ``lnbook.seeds.fit_lm`` as ONE stacked job of every
seed at every rate of its study, two jobs at a time on two worker processes of one CPU thread
each. Wortsman et al.'s protocol: Adam with beta2 = 0.95, gradients clipped to 1, a linear
warm-up over the first 10% of the steps, then a cosine decay to 0 at the last step
(``lnbook.train.warmup_cosine``), 300 steps of 8 windows, no weight decay. The first half of
the corpus's validation split is the validation split (it chooses each arm's rate), the second
half the test split. The studies:

- ``sweep``: 2 blocks of width 64 (4 heads of 16); Pre-LN, Post-LN (no final norm), Pre-LN with
  QK-layernorm, and no norm, each in GPT-2's initialization, and Pre-LN, no norm and Pre-LN with
  QK-layernorm in Xavier's; rates 3e-4 to 3e-1 in half decades.
- ``scale``: Pre-LN and Pre-LN with QK-layernorm at widths 32, 128 and 256 (heads of 16
  features); with ``sweep``'s width 64, four sizes for Wortsman et al.'s sensitivity-against-size
  trend.
- ``zloss``: ``sweep``'s Pre-LN with PaLM's z-loss, weights 1e-4 and 1e-2, at every rate.
- ``depth``: 24 blocks of width 32 (2 heads), Xavier's initialization; Post-LN, Post-LN with
  a warm-up over 30% of the steps, DeepNorm, its up-weighted residual alone (alpha) and its
  down-scaled initialization alone (beta), Sandwich-LN, NormFormer, and Pre-LN with and without
  the final norm; rates 3e-4, 1e-3, 3e-3 and 1e-2.

The width studies record, at every step, the largest attention logit, the lowest head's
attention entropy and the output's log Z (``record_logits``). It writes, with provenance
(machine, commit, date, command, versions) as leading ``#`` lines:

- ``scale_sweep-curves.csv``: study, arm, width, lr, seed, step, then every ``--every`` steps
  the mean training loss since the previous row, the validation loss (every ``--every-val``
  steps, empty otherwise; 4 fixed batches of 32 windows) and the recorded quantities at that step;
- ``scale_sweep-final.csv``: study, arm, width, lr, seed, val_loss and test_loss after the last
  step (8 fixed batches of 32 windows of each half), the largest logit at step 1, the largest
  logit, entropy and log Z at the last step, and stream_rms: the RMS of the residual stream
  after each block and into the head on 32 test windows, ``;``-separated
  (``lnbook.scale_study.stream_rms``). A diverged member's values are ``nan``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from sigmoid_full import add_step_arguments, check_step_arguments, merged, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import cell_study, data, scale_study, seeds, train
from lnbook.scale_study import BATCH, BETA2, BLOCK

SCORE_BATCHES = 8
WIDE_LRS, DEEP_LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1], [3e-4, 1e-3, 3e-3, 1e-2]
POST = dict(norm_position="post", final_norm=False)
DEEP = dict(n_layer=24, init="xavier")
# (study, arm, width, settings, fit options); the largest jobs first, so that two workers finish together
JOBS = [
    *[("depth", arm, 32, {**DEEP, **settings}, fit) for arm, settings, fit in (
        ("Post-LN", POST, {}),
        ("Post-LN + long warm-up", POST, {"warm": 0.3}),
        ("DeepNorm", {**POST, "deepnorm": True}, {}),
        ("DeepNorm alpha only", {**POST, "deepnorm": "alpha"}, {}),
        ("DeepNorm beta only", {**POST, "deepnorm": "beta"}, {}),
        ("Sandwich-LN", {"norm_position": "sandwich"}, {}),
        ("NormFormer", {"normformer": True}, {}),
        ("Pre-LN", {}, {}),
        ("Pre-LN no final norm", {"final_norm": False}, {}),
    )],
    *[("scale", arm, w, settings, {}) for w in (256, 128)
      for arm, settings in (("Pre-LN", {}), ("Pre-LN + QK-norm", {"qk_norm": "layernorm"}))],
    *[("sweep", arm, 64, settings, {}) for arm, settings in (
        ("Pre-LN", {}), ("Post-LN", POST), ("Pre-LN + QK-norm", {"qk_norm": "layernorm"}), ("no norm", {"norm": "none"}),
        ("Pre-LN (Xavier init)", {"init": "xavier"}), ("no norm (Xavier init)", {"norm": "none", "init": "xavier"}),
        ("Pre-LN + QK-norm (Xavier init)", {"qk_norm": "layernorm", "init": "xavier"}))],
    *[("zloss", f"Pre-LN + z-loss {w:g}", 64, {}, {"z_loss": w}) for w in (1e-4, 1e-2)],
    *[("scale", arm, 32, settings, {}) for arm, settings in (("Pre-LN", {}), ("Pre-LN + QK-norm", {"qk_norm": "layernorm"}))],
]
assert not any("," in job[1] for job in JOBS)  # the tables are plain CSV


def at(values: list[float], step: int) -> str:
    """A recorded per-step value at ``step`` (from 1), empty where none was recorded."""
    return f"{values[step - 1]:.6g}" if len(values) >= step else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, every=10)
    parser.set_defaults(seeds=5)
    parser.add_argument("--every-val", type=int, default=50, help="steps between validation losses (a multiple of --every)")
    parser.add_argument("--studies", nargs="+", choices=scale_study.SCALE_STUDIES, default=list(scale_study.SCALE_STUDIES))
    parser.add_argument("--widths", nargs="+", type=int, help="only the jobs of these widths (default: all)")
    parser.add_argument("--arms", nargs="+", help="only these arms (default: all)")
    parser.add_argument("--lrs", nargs="+", type=float, help="only these rates (default: each study's grid)")
    parser.add_argument("--merge", action="store_true",
                        help="replace these jobs' rows (of these rates, with --lrs) in the files already in --out")
    args = parser.parse_args()
    check_step_arguments(parser, args)
    if args.every_val < 1 or args.every_val % args.every or args.steps % args.every_val:
        parser.error("--every-val must be a positive multiple of --every that divides --steps")
    torch.set_num_threads(1)
    corpus = data.char_corpus()
    half = len(corpus.val) // 2
    val_ids, test_ids = corpus.val[:half], corpus.val[half:]
    jobs = [job for job in JOBS if job[0] in args.studies and (not args.widths or job[2] in args.widths)
            and (not args.arms or job[1] in args.arms)]
    head = provenance(f"studies {args.studies}; seeds 0-{args.seeds - 1}; {args.steps} steps of {BATCH} windows of {BLOCK}; "
                      f"Adam beta2 {BETA2}, clip 1, linear warm-up over 10% of the steps (30% for the long warm-up), "
                      f"cosine decay to 0; width lrs {WIDE_LRS}, depth lrs {DEEP_LRS}; corpus {len(corpus.train)} train, "
                      f"{half} validation, {len(test_ids)} test characters (python {sys.version.split()[0]}'s pydoc topics)")
    workers = train.cpu_workers(2)
    queued = []
    for study, arm, width, settings, fit in jobs:
        lrs = args.lrs or (DEEP_LRS if study == "depth" else WIDE_LRS)
        member_seeds, member_lrs = cell_study.grid(lrs, range(args.seeds))
        schedule = scale_study.schedule(args.steps, fit.get("warm", 0.1))
        futures = seeds.start_runs(lambda w=width, s=settings: scale_study.sweep_model(corpus.vocab_size, w, **s),
                                   member_seeds, workers,
                                   train_ids=corpus.train, val_ids=val_ids, steps=args.steps, lr=member_lrs,
                                   block_size=BLOCK, batch_size=BATCH, grad_clip=1.0, eval_every=args.every_val,
                                   warmup=schedule, beta2=BETA2, z_loss=fit.get("z_loss", 0.0),
                                   record_logits=study != "depth")
        queued.append((study, arm, width, member_lrs, member_seeds, futures))
    first = torch.randint(len(test_ids) - BLOCK, (32,), generator=torch.Generator().manual_seed(0))
    probe = train.windows(test_ids, first, BLOCK)[0]
    curves = [",".join(scale_study.SCALE_CURVE_COLUMNS)]
    final = [",".join(scale_study.SCALE_FINAL_COLUMNS)]
    start = time.perf_counter()
    for study, arm, width, member_lrs, member_seeds, futures in queued:
        for future, lr, s in zip(futures, member_lrs, member_seeds):
            model, hist = future.result()
            cell = f"{study},{arm},{width},{lr},{s}"
            val = dict(zip(hist.val_steps, hist.val_loss))
            for step in range(args.every, len(hist.step_loss) + 1, args.every):
                loss = np.mean(hist.step_loss[step - args.every : step])
                validation = f"{val[step]:.6f}" if step in val else ""
                recorded = ",".join(at(getattr(hist, name), step) for name in ("attn_logit_max", "attn_entropy", "log_z"))
                curves.append(f"{cell},{step},{loss:.6g},{validation},{recorded}")
            if hist.diverged:
                final.append(f"{cell}," + ",".join(["nan"] * 7))
                continue
            scores = [train.lm_loss(model, ids, BLOCK, batches=SCORE_BATCHES) for ids in (val_ids, test_ids)]
            recorded = [at(hist.attn_logit_max, 1)] + [at(getattr(hist, n), len(hist.step_loss))
                                                       for n in ("attn_logit_max", "attn_entropy", "log_z")]
            rms = ";".join(f"{v:.6g}" for v in scale_study.stream_rms(model, probe))
            final.append(f"{cell},{scores[0]:.6f},{scores[1]:.6f}," + ",".join(recorded) + f",{rms}")
        print(f"{study}, {arm}, width {width}: done at {time.perf_counter() - start:.0f} s", flush=True)
    tables = {"scale_sweep-curves.csv": curves, "scale_sweep-final.csv": final}
    if args.merge:  # each job is its own stack, so its rows do not depend on the other jobs; with --lrs the stack
        # holds only those rates, and its largest rate (which sets the float rounding) may differ from a full run's
        keys = {(q[0], q[1], str(q[2])) + ((str(lr),) if args.lrs else ()) for q in queued for lr in q[3]}
        head, merged_tables = merged(args.out, head, tables, keys)
        tables = dict(zip(tables, merged_tables))
    write_tables(args.out, head, tables)


if __name__ == "__main__":
    main()
