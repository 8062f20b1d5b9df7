"""Chapter 10's WGAN-GP and VAE runs, stored: the chapter's own settings (so chapter 09 can read
chapter 10's headline numbers, and chapter 10 asserts that its live runs reproduce them) and the
paper's learning rate, which the notebook cannot afford.

    PYTHONPATH=src python benchmarks/generative.py
    PYTHONPATH=src python benchmarks/generative.py --seeds 2 --chapter-steps 2 --paper-steps 2 \
        --vae-steps 2 --arms "LN critic" --workers 1 --out /tmp/x   # a smoke run

Two studies of the WGAN-GP arms of ``lnbook.generative.GAN_ARMS`` (MLP and DCGAN-style
convolutional critics and generators on the 8x8 digits in [-1, 1], five seeds of every arm as
one stacked model, each arm built by ``generative.build_gan`` and trained by
``generative.train_arm`` exactly as the notebook does):

- ``chapter``: every arm at ``generative.CHAPTER_GAN`` (150 generator steps, five critic steps
  each, Adam at 1e-3 with betas (0, 0.9), batches of 64, lambda = 10 unless the arm says 0);
- ``paper``: the critics without a norm, with LayerNorm and with BatchNorm, the two BatchNorm
  controls that decide the chapter's causal question (joint batches, a per-example penalty), and
  the convolutional critics without a norm and with BatchNorm, at ``generative.PAPER_GAN``:
  Gulrajani et al.'s Algorithm 1 with its learning rate 1e-4 and betas (0, 0.9), 1,000
  generator steps.

At every evaluation (every 15 or 100 generator steps) each member draws 360 samples from fixed
noise (eval mode) and chapter 10's judge (``generative.digits_judge``, trained on the training
digits) scores them: Fréchet distance of its 128 hidden features to the training digits', its
confidence and the classes it finds. The ``chapter`` study also trains the VAEs with no,
batch and layer norm (``generative.CHAPTER_VAE``, 800 steps) and stores their held-out ELBO in
eval mode (``generative.heldout_elbo``, ten noise draws).

A third study, ``vae-long`` (``--studies vae-long``), trains the same three VAEs for
``generative.LONG_VAE``'s 5,000 steps (the notebook's FULL setting) and stores the held-out ELBO
in eval mode every 200 steps (step 800 is the chapter's budget, the same numbers as the ``chapter`` VAEs), and at the end: the mean training objective of the last 200 steps
(training mode, batch statistics, what Adam climbed), the eval-mode ELBO of the training digits
and the held-out ELBO scored as one batch of 360 with its own statistics.

A fourth study, ``vae-rates`` (``--studies vae-rates``), trains the three VAEs at each rate of
``generative.VAE_RATES`` (3e-4, 1e-3, 3e-3; ``--rates``) for ``LONG_VAE``'s 5,000 steps on the
fit part of the training digits (``data.validation_split``, stratified, 20% held out as
validation; the test digits are never seen until scored) and stores, every 200 steps, the ELBO
in eval mode of the validation digits (on which the chapter picks each norm's rate) and of the
test digits, and at the end the training objective of the last 200 steps and the eval-mode ELBO
of the fit digits (the train/eval gap). It writes ``generative-vae-rates.csv`` (norm, lr, seed,
step, measure, value).

Writes ``generative-gan.csv`` (study, arm, seed, step, fd, confidence, classes),
``generative-vae.csv`` (study, norm, seed, heldout_elbo) and ``generative-vae-long.csv`` (norm,
seed, step, measure, value) with provenance as leading ``#`` lines; by default into
``src/lnbook/results/``, read by ``generative.stored_generative()``. ``--studies`` picks which
(and writes only their files). Two worker processes of one torch thread each (``--workers``).

The arm "BN critic, joint batches, per-example penalty" was added after the first run; its
chapter-study rows were appended to the stored ``generative-gan.csv`` from
``--studies gan --arms "BN critic, joint batches, per-example penalty"`` (a ``# appended`` line
says so); every other row is the first run's.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from sigmoid_full import provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import data
from lnbook import generative as G

RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"
PAPER_ARMS = ["no-norm critic", "LN critic", "BN critic", "BN critic, joint batches", "BN critic, per-example penalty",
              "conv, no-norm critic", "conv, BN critic"]
_STATE: dict = {}


def _setup() -> None:
    """Each worker: one thread, the chapter's data and judge (as the notebook builds them)."""
    torch.set_num_threads(1)
    (train_x, train_y), (test_x, test_y) = data.digits_sequences(order="row")
    train_flat, test_flat = train_x.flatten(1), test_x.flatten(1)
    _STATE["judge"] = G.digits_judge((train_flat, train_y), (test_flat, test_y))
    _STATE["pool"] = train_flat * 2 - 1
    _STATE["binary"] = ((train_flat > 0.5).float(), (test_flat > 0.5).float())
    (fit_x, _), (val_x, _) = data.validation_split((train_flat, train_y))
    _STATE["split"] = ((fit_x > 0.5).float(), (val_x > 0.5).float(), _STATE["binary"][1])


def _gan(study: str, arm: str, seeds: list[int], settings: dict) -> tuple[list[str], float]:
    start = time.perf_counter()
    _, _, h = G.train_arm(G.GAN_ARMS[arm], seeds, _STATE["pool"], _STATE["judge"], settings)
    rows = [f"{study},\"{arm}\",{s},{step},{h.evals['fd'][m, t]:.9g},{h.evals['confidence'][m, t]:.9g},"
            f"{h.evals['classes'][m, t]:.9g}" for m, s in enumerate(seeds) for t, step in enumerate(h.eval_steps)]
    return rows, time.perf_counter() - start


def _vae(norm: str, seeds: list[int], settings: dict) -> tuple[list[str], float]:
    start = time.perf_counter()
    binary_train, binary_test = _STATE["binary"]
    model = G.vae(norm, seeds)
    G.train_vae(model, binary_train, **settings)
    heldout = G.heldout_elbo(model.eval(), binary_test).numpy()
    return [f"chapter,{norm},{s},{heldout[m]:.9g}" for m, s in enumerate(seeds)], time.perf_counter() - start


def _vae_long(norm: str, seeds: list[int], settings: dict) -> tuple[list[str], float]:
    start = time.perf_counter()
    binary_train, binary_test = _STATE["binary"]
    model = G.vae(norm, seeds)
    rows: list[str] = []

    def evaluate(step: int, vae: G.VAE) -> None:
        heldout = G.heldout_elbo(vae, binary_test).numpy()
        rows.extend(f"{norm},{s},{step},heldout,{heldout[m]:.9g}" for m, s in enumerate(seeds))

    curve = G.train_vae(model, binary_train, **settings, evaluate=evaluate)
    steps = settings["steps"]
    model.eval()
    final = {"train_objective": curve[:, -min(200, steps):].mean(1),  # training mode, batch statistics
             "train_eval": G.heldout_elbo(model, binary_train).numpy(),  # the training digits, eval mode
             "heldout_batch": G.heldout_elbo(model, binary_test, batch_stats=True).numpy()}  # one batch of 360
    rows += [f"{norm},{s},{steps},{key},{v[m]:.9g}" for key, v in final.items() for m, s in enumerate(seeds)]
    return rows, time.perf_counter() - start


def _vae_rates(norm: str, lr: float, seeds: list[int], settings: dict) -> tuple[list[str], float]:
    """One norm at one rate: trained on the fit part of the training digits, scored (eval mode)
    on the validation part and on the test digits at every checkpoint, and the two final
    measures of the train/eval gap on the fit digits."""
    start = time.perf_counter()
    fit, val, test = _STATE["split"]
    model = G.vae(norm, seeds)
    rows: list[str] = []

    def evaluate(step: int, vae: G.VAE) -> None:
        for split, x in (("validation", val), ("test", test)):
            values = G.heldout_elbo(vae, x).numpy()
            rows.extend(f"{norm},{lr:g},{s},{step},{split},{values[m]:.9g}" for m, s in enumerate(seeds))

    curve = G.train_vae(model, fit, **settings, lr=lr, evaluate=evaluate)
    steps = settings["steps"]
    model.eval()
    final = {"train_objective": curve[:, -min(200, steps):].mean(1),  # training mode, batch statistics
             "train_eval": G.heldout_elbo(model, fit).numpy()}  # the fit digits, eval mode
    rows += [f"{norm},{lr:g},{s},{steps},{key},{v[m]:.9g}" for key, v in final.items() for m, s in enumerate(seeds)]
    return rows, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--chapter-steps", type=int, default=G.CHAPTER_GAN["steps"])
    parser.add_argument("--paper-steps", type=int, default=G.PAPER_GAN["steps"])
    parser.add_argument("--vae-steps", type=int, default=G.CHAPTER_VAE["steps"])
    parser.add_argument("--vae-long-steps", type=int, default=G.LONG_VAE["steps"])
    parser.add_argument("--vae-long-every", type=int, default=G.LONG_VAE["every"])
    parser.add_argument("--studies", nargs="+", choices=["gan", "vae", "vae-long", "vae-rates"],
                        default=["gan", "vae", "vae-long", "vae-rates"])
    parser.add_argument("--rates", type=float, nargs="+", default=list(G.VAE_RATES), help="the vae-rates study's grid")
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all of each study)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    unknown = set(args.arms or []) - set(G.GAN_ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; known: {list(G.GAN_ARMS)}")
    seeds = list(range(args.seeds))
    chapter = G.CHAPTER_GAN | {"steps": args.chapter_steps}
    paper = G.PAPER_GAN | {"steps": args.paper_steps}
    long_vae = G.LONG_VAE | {"steps": args.vae_long_steps, "every": args.vae_long_every}
    wanted = (lambda names: [a for a in names if args.arms is None or a in args.arms])
    head = provenance(f"seeds 0-{args.seeds - 1}; chapter: {chapter}; paper: {paper}; MLP generator {G.GEN_HIDDEN}, "
                      f"critic {G.CRIT_HIDDEN}, conv channels {G.CONV_CHANNELS}; VAE {G.CHAPTER_VAE | {'steps': args.vae_steps}}; "
                      f"long VAE {long_vae}; VAE rates {args.rates} at {long_vae} on the fit part of the training digits "
                      f"(data.validation_split, fraction 0.2)")
    jobs = [("chapter", a, chapter) for a in wanted(list(G.GAN_ARMS))] + [("paper", a, paper) for a in wanted(PAPER_ARMS)]
    jobs = jobs if "gan" in args.studies else []
    jobs.sort(key=lambda j: -j[2]["steps"])  # the long runs first, so the two workers finish together
    gan_rows, vae_rows = ["study,arm,seed,step,fd,confidence,classes"], ["study,norm,seed,heldout_elbo"]
    long_rows = ["norm,seed,step,measure,value"]
    rate_rows = ["norm,lr,seed,step,measure,value"]
    with ProcessPoolExecutor(args.workers, initializer=_setup) as pool:
        long_futures = [(n, pool.submit(_vae_long, n, seeds, long_vae)) for n in G.NORMS] if "vae-long" in args.studies else []
        rate_futures = [((n, lr), pool.submit(_vae_rates, n, lr, seeds, {k: v for k, v in long_vae.items() if k != "lr"}))
                        for n in G.NORMS for lr in args.rates] if "vae-rates" in args.studies else []
        gan_futures = [(j, pool.submit(_gan, j[0], j[1], seeds, j[2])) for j in jobs]
        vae_futures = [(n, pool.submit(_vae, n, seeds, G.CHAPTER_VAE | {"steps": args.vae_steps}))
                       for n in G.NORMS] if "vae" in args.studies else []
        for (study, arm, _), future in gan_futures:
            rows, seconds = future.result()
            gan_rows += rows
            print(f"{study}, {arm}: {seconds:.0f} s", flush=True)
        for norm, future in vae_futures:
            rows, seconds = future.result()
            vae_rows += rows
            print(f"VAE {norm}: {seconds:.0f} s", flush=True)
        for norm, future in long_futures:
            rows, seconds = future.result()
            long_rows += rows
            print(f"long VAE {norm}: {seconds:.0f} s", flush=True)
        for (norm, lr), future in rate_futures:
            rows, seconds = future.result()
            rate_rows += rows
            print(f"VAE {norm} at {lr:g}: {seconds:.0f} s", flush=True)
    files = {"gan": ("generative-gan.csv", gan_rows), "vae": ("generative-vae.csv", vae_rows),
             "vae-long": ("generative-vae-long.csv", long_rows), "vae-rates": ("generative-vae-rates.csv", rate_rows)}
    write_tables(args.out, head, dict(files[s] for s in args.studies))


if __name__ == "__main__":
    main()
