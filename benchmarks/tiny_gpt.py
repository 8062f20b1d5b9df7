"""Chapter 06's training runs, ten seeds each, once, outside the notebook (which cannot afford
them in its 180 s).

    PYTHONPATH=src python benchmarks/tiny_gpt.py
    PYTHONPATH=src python benchmarks/tiny_gpt.py --steps 4 --seeds 2 --out /tmp/x   # a smoke run

Every arm is a ``lnbook.transformer.TinyGPT`` of 4 layers, width 64 and 4 heads on windows of
32 characters of ``lnbook.data.char_corpus()``, trained as ONE stacked job of every seed at
every rate of its study (``lnbook.cell_study.grid``) by ``lnbook.seeds.fit_lm`` (``fit_mlm``
for the encoder), two jobs at a time on two worker processes of one CPU thread each. The
first half of the corpus's validation split is the validation split (it chooses each arm's
rate), the second half the test split. The studies:

- ``warmup``: Xiong et al.'s regime, Xavier initialization, no gradient clipping, 300 steps of
  8 windows; Post-LN (no final norm) and Pre-LN, each with Adam from the first step, Adam with
  a 100-step linear warm-up, RAdam, and Adam on RAdam's step sizes; and both with Adam in GPT-2's
  initialization; rates 1e-3 to 3e-2.
- ``norms``: GPT-2's initialization, Pre-norm, 300 steps of 16 windows, a 50-step warm-up,
  gradients clipped to 1; LayerNorm, RMSNorm, no norm, DyT everywhere, DyT by site (in the
  blocks with a LayerNorm or no final norm; LayerNorm blocks with a final DyT starting at alpha
  0.5 or 32, the scale of a norm at initialization), and the LLaMA
  wiring with RMSNorm and with Zhu et al.'s DyT recipe (no bias, token embedding times a
  learnable scalar starting at sqrt(64) = 8, alpha_0 per site); rates 1e-3 to 1e-2.
- ``mlm``: the BERT preset (embedding LayerNorm, BERT's initialization, attention both ways)
  on padded windows of 8 to 32 characters with 30% masked, 300 steps of 16; Post-LN with and
  without a 100-step warm-up, and Pre-LN; rates 1e-3 to 1e-2.
- ``batchnorm``: ``norms``' setting with BatchNorm over the batch and time, scored also in
  training mode (the batch's statistics, future positions included) and with population
  statistics.

It writes, with provenance (machine, commit, date, command, versions) as leading ``#`` lines:

- ``tiny_gpt-curves.csv``: study, arm, lr, seed, step, val_loss: the validation loss every
  ``--every`` steps (4 fixed batches of 32 windows, as ``fit_lm`` scores);
- ``tiny_gpt-final.csv``: study, arm, lr, seed, val_loss, test_loss after the last step (8 fixed
  batches of 32 windows of each half); stream_std, the standard deviation of the stream
  entering the final norm on the first test batch; final_alpha, the final DyT's alpha (empty
  without one); test_loss_batch and test_loss_population, a batch-norm model's test loss in
  training mode (the same windows, normalized 16 at a time, as it trained) and with population
  statistics over 32 batches of training windows (empty for the others). A diverged member's losses are ``nan``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from sigmoid_full import add_step_arguments, check_step_arguments, merged, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import cell_study, data, seeds, train, transformer_study
from lnbook.norms import DyT
from lnbook.transformer import GPTConfig, TinyGPT, preset

SIZE, BLOCK, SCORE_BATCHES = dict(n_layer=4, n_head=4, d_model=64), 32, 8
MLM = dict(min_len=8, mask_rate=0.3)
POST, PRE = dict(norm_position="post", final_norm=False), dict(norm_position="pre", final_norm=True)
LLAMA = dict(norm="rmsnorm", bias=False, tie_head=False)  # LLaMA's head is its own
DYT_RECIPE = dict(norm="dyt", bias=False, embed_scale=True, tie_head=False)
STUDIES = {
    "warmup": dict(lrs=[1e-3, 3e-3, 1e-2, 3e-2], batch_size=8, grad_clip=None, arms={
        f"{name}{label}": ({**wiring, "init": "xavier"}, fit)
        for name, wiring in (("Post-LN", POST), ("Pre-LN", PRE))
        for label, fit in (("", {}), (" + warm-up", {"warmup": 100}), (" + RAdam", {"optimizer": "radam"}),
                           (" + RAdam's step sizes", {"warmup": train.radam_factor}))}
        | {f"{name} (GPT-2 init)": (wiring, {}) for name, wiring in (("Post-LN", POST), ("Pre-LN", PRE))}),
    "norms": dict(lrs=[1e-3, 3e-3, 1e-2], batch_size=16, grad_clip=1.0, arms={
        "LayerNorm": (dict(norm="layernorm"), {"warmup": 50}),
        "RMSNorm": (dict(norm="rmsnorm"), {"warmup": 50}),
        "no norm": (dict(norm="none"), {"warmup": 50}),
        "DyT": (dict(norm="dyt"), {"warmup": 50}),
        "DyT + own head": (dict(norm="dyt", tie_head=False), {"warmup": 50}),
        "DyT blocks + LayerNorm final": (dict(norm="dyt", final_norm="layernorm"), {"warmup": 50}),
        "DyT blocks + no final norm": (dict(norm="dyt", final_norm=False), {"warmup": 50}),
        "LayerNorm blocks + DyT final": (dict(norm="layernorm", final_norm="dyt"), {"warmup": 50}),
        "LayerNorm blocks + DyT final (alpha 32)": (dict(norm="layernorm", final_norm="dyt", dyt_alpha=(0.5, 0.5, 32.0)),
                                                    {"warmup": 50}),
        "LLaMA RMSNorm": (LLAMA, {"warmup": 50}),
        "LLaMA DyT recipe (0.8/0.2/0.2)": ({**DYT_RECIPE, "dyt_alpha": (0.8, 0.2, 0.2)}, {"warmup": 50}),
        "LLaMA DyT recipe (0.5/0.5/0.5)": ({**DYT_RECIPE, "dyt_alpha": 0.5}, {"warmup": 50}),
    }),
    "mlm": dict(lrs=[1e-3, 3e-3, 1e-2], batch_size=16, grad_clip=1.0, arms={
        "Post-LN": (POST, {}), "Post-LN + warm-up": (POST, {"warmup": 100}), "Pre-LN": (PRE, {})}),
    "batchnorm": dict(lrs=[1e-3, 3e-3, 1e-2], batch_size=16, grad_clip=1.0, arms={
        "BatchNorm": (dict(norm="batchnorm"), {"warmup": 50})}),
}
assert not any("," in arm for spec in STUDIES.values() for arm in spec["arms"])  # the tables are plain CSV


def make(study: str, settings: dict, vocab_size: int) -> TinyGPT:
    if study == "mlm":  # one more token id, [MASK]
        return TinyGPT(preset("bert", vocab_size + 1, BLOCK, **SIZE, **settings))
    return TinyGPT(GPTConfig(vocab_size, BLOCK, **SIZE, **settings))


def scores(study: str, model: TinyGPT, val_ids: torch.Tensor, test_ids: torch.Tensor, corpus: data.CharCorpus) -> list[float]:
    """val_loss, test_loss, stream_std, final_alpha, test_loss_batch, test_loss_foreign, test_loss_population of one
    trained member."""
    if study == "mlm":
        loss = lambda ids: train.mlm_loss(model, ids, BLOCK, corpus.vocab_size, **MLM, batches=SCORE_BATCHES)  # noqa: E731
    else:
        loss = lambda ids: train.lm_loss(model, ids, BLOCK, batches=SCORE_BATCHES)  # noqa: E731
    first = torch.randint(len(test_ids) - BLOCK, (32,), generator=torch.Generator().manual_seed(0))
    idx = train.windows(test_ids, first, BLOCK)[0]
    alpha = model.norm_f.norm.alpha.item() if isinstance(model.norm_f.norm, DyT) else math.nan
    row = [loss(val_ids), loss(test_ids), transformer_study.head_input_std(model, idx), alpha, math.nan, math.nan, math.nan]
    if study == "batchnorm":
        group = STUDIES[study]["batch_size"]
        row[4] = transformer_study.lm_loss_batch_statistics(model, test_ids, BLOCK, batches=SCORE_BATCHES, group=group)
        row[5] = transformer_study.lm_loss_foreign_statistics(model, test_ids, BLOCK, batches=SCORE_BATCHES, group=group)
        population = transformer_study.with_population_statistics(model, corpus.train, BLOCK)
        row[6] = train.lm_loss(population, test_ids, BLOCK, batches=SCORE_BATCHES)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", nargs="+", choices=list(STUDIES), default=list(STUDIES))
    add_step_arguments(parser, every=25)
    parser.add_argument("--arms", nargs="+", help="only these arms of the studies (default: all)")
    parser.add_argument("--merge", action="store_true",
                        help="replace these arms' rows in the files already in --out, keeping the others")
    args = parser.parse_args()
    check_step_arguments(parser, args)
    torch.set_num_threads(1)
    corpus = data.char_corpus()
    half = len(corpus.val) // 2
    val_ids, test_ids = corpus.val[:half], corpus.val[half:]
    head = provenance(f"studies {args.studies}; seeds 0-{args.seeds - 1}; {args.steps} steps; model {SIZE}, windows of "
                      f"{BLOCK}; corpus {len(corpus.train)} train, {half} validation, {len(test_ids)} test characters "
                      f"(python {sys.version.split()[0]}'s pydoc topics); " + "; ".join(
                          f"{s}: lrs {STUDIES[s]['lrs']}, batch {STUDIES[s]['batch_size']}, clip {STUDIES[s]['grad_clip']}"
                          for s in args.studies))
    workers = train.cpu_workers(2)
    queued = []
    for study in args.studies:
        spec = STUDIES[study]
        member_seeds, member_lrs = cell_study.grid(spec["lrs"], range(args.seeds))
        for arm, (settings, fit_args) in spec["arms"].items():
            if args.arms and arm not in args.arms:
                continue
            options = dict(train_ids=corpus.train, val_ids=val_ids, steps=args.steps, lr=member_lrs, block_size=BLOCK,
                           batch_size=spec["batch_size"], grad_clip=spec["grad_clip"], eval_every=args.every, **fit_args)
            if study == "mlm":
                options.update(fit=seeds.fit_mlm, mask_id=corpus.vocab_size, **MLM)
            futures = seeds.start_runs(lambda s=study, c=settings: make(s, c, corpus.vocab_size), member_seeds, workers,
                                       **options)
            queued.append((study, arm, member_lrs, member_seeds, futures))
    curves = [",".join(transformer_study.TINY_GPT_CURVE_COLUMNS)]
    final = [",".join(transformer_study.TINY_GPT_FINAL_COLUMNS)]
    start = time.perf_counter()
    for study, arm, member_lrs, member_seeds, futures in queued:
        for future, lr, s in zip(futures, member_lrs, member_seeds):
            model, hist = future.result()
            curves += [f"{study},{arm},{lr},{s},{step},{loss:.6f}" for step, loss in zip(hist.val_steps, hist.val_loss)]
            row = [math.nan] * 7 if hist.diverged else scores(study, model, val_ids, test_ids, corpus)
            final.append(f"{study},{arm},{lr},{s}," + ",".join("" if math.isnan(v) and i > 1 else f"{v:.6f}"
                                                                 for i, v in enumerate(row)))
        print(f"{study}, {arm}: done at {time.perf_counter() - start:.0f} s", flush=True)
    if args.merge:  # each arm is its own job, so its rows do not depend on which others ran with it
        head, (curves, final) = merged(args.out, head, {"tiny_gpt-curves.csv": curves, "tiny_gpt-final.csv": final},
                                       {(q[0], q[1]) for q in queued})
    write_tables(args.out, head, {"tiny_gpt-curves.csv": curves, "tiny_gpt-final.csv": final})


if __name__ == "__main__":
    main()
