"""Command line: parse, validate, call one function per verb. User errors print one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from diffscale import fast_start
from diffscale.cli_parser import ExampleFormatter, Parser, verb
from diffscale.config import ConfigSources, resolve_config
from diffscale.errors import EXIT_USER_ERROR, UserError, check_seed
from diffscale.io.paths import file_target, folder_target, refused
from diffscale.io.streams import outlive_readers


def config_sources(args: argparse.Namespace) -> ConfigSources:
    """A verb's flags as config sources; resuming without a config reads the run's own one."""
    config_path = getattr(args, "config", None)
    out = getattr(args, "out", None)
    if not config_path and getattr(args, "resume", None) and out and (Path(out) / "config.yaml").is_file():
        config_path = str(Path(out) / "config.yaml")  # resuming: the run's own resolved config
    return ConfigSources(preset=args.preset, config_file=config_path, data=getattr(args, "data", None),
                         device=getattr(args, "device", None), precision=getattr(args, "precision", None),
                         recipe=getattr(args, "recipe", None), overrides=getattr(args, "set", None) or [])


def at_least(value: int | None, least: int, flag: str, example: str) -> None:
    """A numeric flag below its range is refused up front, naming the range."""
    if value is not None and value < least:
        raise UserError(f"{flag} {value} is out of range (it must be {least} or more)", f"e.g. {flag} {example}")


def train_out(args: argparse.Namespace, preset: str) -> tuple[str, str]:
    """(run dir, a line saying why where it is not asked for): ``--out``; else, resuming with a run
    dir's own config.yaml, that run dir; else runs/PRESET."""
    if args.out:
        return str(args.out), ""
    config = Path(args.config) if args.config else None
    if args.resume and config is not None and config.name == "config.yaml":
        from diffscale.runtime.checkpoint import list_checkpoints

        if list_checkpoints(config.parent):  # `train RUN/config.yaml --resume auto` continues RUN
            return str(config.parent), f"resuming the run in {config.parent}, the folder of {config}"
    return os.path.join("runs", preset), ""


def cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console

    at_least(args.max_steps, 1, "--max-steps", "100")
    cfg = resolve_config(config_sources(args))
    where, why = train_out(args, cfg.preset)
    out = folder_target(where, "--out")
    if args.dry_run:
        print(cfg.to_yaml(), end="")
        return 0
    console = Console(stderr=True, soft_wrap=True)  # progress on stderr; the result (the run dir) on stdout
    if why:
        console.print(why, markup=False, highlight=False)
    from diffscale.training.loop import train

    outcome = train(cfg, out, resume=args.resume, max_steps=args.max_steps, console=console, force=args.force)
    if outcome.main:  # one line per run, not per rank
        print(outcome.run_dir)
    return outcome.exit_code


def _check_guidance(guidance: float | None) -> None:
    if guidance is not None and not -float("inf") < guidance < float("inf"):  # inf drew all-black images
        raise UserError(f"--guidance {guidance} is not a finite number",
                        "use a guidance scale of 0 or more, such as 2 (1: the class-conditional prediction alone)")
    if guidance is not None and not guidance >= 0:
        raise UserError(f"--guidance {guidance} is negative",
                        "use 0 or more (1: the class-conditional prediction alone, no guidance; the run's default "
                        "is train.sample_guidance, 2)")


def cmd_sample(args: argparse.Namespace) -> int:
    from rich.console import Console

    from diffscale.inference.sample import sample_run
    from diffscale.io.media import MP4_MISSING, mp4_writer_installed

    at_least(args.n, 1, "--n", "64")
    at_least(args.steps, 1, "--steps", "15")
    at_least(args.members, 1, "--members", "16")
    check_seed(args.seed)
    _check_guidance(args.guidance)
    if args.cond and (args.classes or args.guidance is not None):
        raise UserError("--class and --guidance are for class-conditional image runs; --cond is for fields runs",
                        "drop --class and --guidance, or drop --cond")
    if args.cond:
        return sample_ensembles(args)
    if args.members is not None:
        raise UserError("--members is the ensemble size for the conditions of --cond",
                        "add --cond FILE, or drop --members")
    if args.out:
        file_target(args.out, "--out", example="samples.png")
    status = Console(stderr=True, soft_wrap=True)  # progress and notes on stderr: stdout lists the files written
    written = sample_run(args.run_dir, n=args.n or 64, steps=args.steps, seed=args.seed, sampler=args.sampler,
                         gif=args.gif, out=args.out, device=args.device, console=status, classes=args.classes or (),
                         guidance=args.guidance)
    for path in written:
        print(path)
    if args.gif and not mp4_writer_installed():
        status.print(f"note: {MP4_MISSING}", markup=False, highlight=False)
    return 0


def sample_ensembles(args: argparse.Namespace) -> int:
    """``sample --cond FILE``: ensembles as arrays (fields runs; other tasks refuse)."""
    from diffscale.inference.sample import write_ensembles

    for flag, given in (("--n", args.n is not None), ("--gif", args.gif)):
        if given:
            raise UserError(f"{flag} is for samples drawn as pictures; --cond writes ensembles as arrays",
                            f"drop {flag} (--members sets the ensemble size per condition)")
    if args.out:
        file_target(args.out, "--out", example="ensembles.npz")
        if not args.out.endswith(".npz"):
            raise UserError(f"--out '{args.out}' with --cond is written as a NumPy archive", "name it FILE.npz")
    out = write_ensembles(args.run_dir, args.cond, args.out, members=args.members or 16, steps=args.steps,
                          seed=args.seed, sampler=args.sampler, device=args.device)
    print(out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from diffscale.inference.export import export_run

    if not args.diffusers and not args.push_to_hub:
        raise UserError("export needs a place to write: --diffusers OUT_DIR, --push-to-hub REPO, or both",
                        f"e.g. diffscale export {args.run_dir} --diffusers exports/{Path(args.run_dir).name}")
    if args.private and not args.push_to_hub:
        raise UserError("--private is a setting of the Hub repo, and nothing is pushed",
                        "add --push-to-hub REPO, or drop --private")
    out = folder_target(args.diffusers, "--diffusers") if args.diffusers else None
    for line in export_run(Path(args.run_dir), out, license_id=args.license, repo=args.push_to_hub,
                           token_file=args.token_file, private=args.private):
        print(line)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from diffscale.inference.evaluate import evaluate_run

    at_least(args.count, 1, "--count", "50")
    at_least(args.steps, 1, "--steps", "10")
    at_least(args.max_episode_steps, 1, "--max-episode-steps", "50")
    at_least(args.checkpoint, 0, "--checkpoint", "1000")
    if args.features is not None and args.features.count(":") != 1:
        raise UserError(f"--features '{args.features}' is not module:function",
                        "name a function returning a torch module, e.g. mypackage.features:build")
    check_seed(args.seed)
    _check_guidance(args.guidance)
    return evaluate_run(Path(args.run_dir), count=args.count, steps=args.steps, seed=args.seed,
                        device=args.device, as_json=args.json, env=args.env, max_episode_steps=args.max_episode_steps,
                        sampler=args.sampler, checkpoint=args.checkpoint, features=args.features, data=args.data,
                        guidance=args.guidance)


def cmd_presets(args: argparse.Namespace) -> int:
    from diffscale.config.presets import PRESETS
    from diffscale.io.tables import Column, print_table

    rows: list[dict[str, Any]] = []
    for name, info in PRESETS.items():
        cfg = info.build()
        rows.append({"preset": name, "task": cfg.task, "network": cfg.model.summary(), "params": info.params,
                     "batch_per_gpu": cfg.train.batch_per_gpu, "for": info.purpose})
    if args.json:
        print(json.dumps(rows))
        return 0
    columns = [Column("preset", 0, wrap=False), Column("task", 2, wrap=False), Column("network", 3),
               Column("params", 2, wrap=False, justify="right"), Column("batch/GPU", 4, wrap=False, justify="right"),
               Column("for", 1)]
    print_table("diffscale presets", columns, [[r["preset"], r["task"], r["network"], f"{r['params'] / 1e6:.1f} M",
                                                str(r["batch_per_gpu"]), r["for"]] for r in rows])
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from diffscale.runtime.sysinfo import collect, markdown

    facts = collect()
    print(json.dumps(facts) if args.json else markdown(facts))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from diffscale.report.page import write_report

    out = file_target(args.out, "--out", example="report.html") if args.out else None
    print(write_report(Path(args.run_dir), out))
    return 0


def _device_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"],
                   help="where to run (default: the config's runtime.device; auto picks CUDA, then MPS, then CPU)")


CORE_VERBS = frozenset({"train", "sample", "export", "eval", "presets", "report", "env"})
"""The verbs this module defines; the others (cluster, bench, doctor) register themselves."""


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``verb`` one of :data:`CORE_VERBS` (the verb about to run), without
    the verbs other modules register: importing cluster planning, bench and doctor added time to
    every ``diffscale train`` start, for verbs the job never parses."""
    from diffscale.version import __version__

    parser = Parser(
        prog="diffscale",
        description="Train diffusion models on a laptop, a GPU, a node or a SLURM / Grid Engine cluster "
                    "with one config.",
        epilog="example:\n  diffscale train            # the CPU demo\n  diffscale train --help     # each verb's "
               "options and an example", formatter_class=ExampleFormatter,
    )
    parser.add_argument("--version", action="version", version=f"diffscale {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_trained_run_verbs(sub)
    if verb not in CORE_VERBS:
        _register_optional(sub)
    return parser


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = verb(sub, "train", "train a diffusion model (no arguments: the CPU demo)",
             "diffscale train --preset small --data builtin:glyphs --out runs/glyphs --set train.steps=2000")
    p.add_argument("config", nargs="?", help="YAML config (e.g. a RUN_DIR/config.yaml)")
    p.add_argument("--preset", help="start from a preset (see `diffscale presets`)")
    p.add_argument("--data", help="data spec: images builtin[:glyphs|numerals|digits|mix], imagefolder:PATH, npz:PATH, "
                   "emnist:ROOT[:split], mnist:ROOT, webdataset:DIR_OR_GLOB, parquet:PATH[:COLUMN]; "
                   "fields builtin:fields, npz:PATH, spool:DIR[:N]; "
                   "policy builtin:reach2d[-routes], npz:PATH, zarr:PATH, lerobot:PATH")
    p.add_argument("--out", help="run directory (default runs/PRESET)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. train.steps=500")
    p.add_argument("--resume", metavar="auto|PATH", help="continue from the newest checkpoint (auto) or a given one")
    p.add_argument("--max-steps", type=int,
                   help="stop this invocation at this step (the run's target stays train.steps)")
    _device_flag(p)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                   help="forward/backward precision (auto: bf16 where the GPU has it, fp16 on older GPUs, fp32 on CPU)")
    p.add_argument("--recipe", choices=["fast", "plain"],
                   help="fast (default: compiled, resident data) or plain (the common recipe, for comparison)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("--force", action="store_true",
                   help="take the run dir's lock from a trainer on another host that has ended (a killed job)")
    p.set_defaults(func=cmd_train)


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = verb(sub, "sample", "generate samples from a trained run (EMA weights)",
             "diffscale sample runs/tiny --n 64 --steps 50 --gif")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a trained run (the --out of diffscale train)")
    p.add_argument("--n", type=int, help="samples to generate (default 64)")
    p.add_argument("--cond", metavar="FILE", help="fields runs: conditions (N x C, the data's units) in a .npy, or "
                   "the array 'cond' of a .npz; writes their ensembles and conditions to --out (an .npz)")
    p.add_argument("--members", type=int, metavar="M", help="ensemble members per condition of --cond (default 16)")
    p.add_argument("--class", dest="classes", action="append", metavar="A",
                   help="class-conditional image runs: the class to draw, a name or an index (a comma list, or "
                        "repeated: each class a block of grid rows; default: classes spread over the rows)")
    p.add_argument("--guidance", type=float, metavar="W",
                   help="class-conditional image runs: classifier-free guidance scale, eps_u + W (eps_c - eps_u) "
                        "(1: no guidance, 0: unconditional; default: the run's train.sample_guidance, 2)")
    p.add_argument("--steps", type=int,
                   help="denoising steps (default: the run's train.sample_steps, 15 for new image and field runs; "
                        "at most the run's diffusion.num_train_timesteps, to which more are capped)")
    p.add_argument("--sampler", choices=["ddim", "dpmsolver", "ddpm"],
                   help="ddim, dpmsolver (DPM-Solver++: fewer steps for the same quality) or ddpm (default: the "
                        "run's train.sample_sampler, dpmsolver for new image and field runs, ddpm for policies); "
                        "--steps applies to each (DDPM strided)")
    p.add_argument("--seed", type=int, default=0, help="noise seed: the same seed gives the same samples (default 0)")
    p.add_argument("--gif", action="store_true", help="also write the denoising trajectory as GIF, and as MP4 where "
                   "imageio-ffmpeg is installed (pip install 'diffscale[video]')")
    _device_flag(p)
    p.add_argument("--out", help="PNG path, or with --cond an .npz (default RUN_DIR/samples/...)")
    p.set_defaults(func=cmd_sample)


def _add_trained_run_verbs(sub: argparse._SubParsersAction) -> None:
    """Verbs that read a run folder (sample, export, eval, report) and the catalogue ones."""
    _add_sample(sub)

    _add_export(sub)

    p = verb(sub, "eval", "evaluate a trained run (policy: closed-loop rollouts; fields: ensemble scores; images: "
             "Frechet distance, precision/recall)", "diffscale eval runs/pusht --env pusht --count 50 --json")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a trained run (the --out of diffscale train)")
    p.add_argument("--count", type=int, help="rollouts (policy), ensemble members (fields) or generated images "
                   "(images); default: the task's (images: train.eval_count)")
    p.add_argument("--checkpoint", type=int, metavar="STEP", help="the checkpoint of this step (default: the newest)")
    p.add_argument("--sampler", choices=["ddim", "dpmsolver", "ddpm"],
                   help="reverse process (default: images and fields the run's train.sample_sampler, policy ddpm)")
    p.add_argument("--features", metavar="MODULE:FUNCTION", help="images: a function returning your own feature "
                   "network (a torch module, images in [-1, 1] -> features) instead of diffscale's per-data-set one")
    p.add_argument("--steps", type=int,
                   help="denoising steps per generated sample (default: the run's train.sample_steps)")
    p.add_argument("--guidance", type=float, metavar="W",
                   help="class-conditional image runs: the classifier-free guidance scale the samples are drawn "
                        "with (default: the run's train.sample_guidance, 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rollouts / ensembles (default 0)")
    p.add_argument("--env", default="auto",
                   help="where a policy is rolled out: auto (reach2d or reach2d-routes for the built-in data), "
                   "reach2d, reach2d-routes, or pusht (gym-pusht's PushT; pip install 'diffscale[pusht]')")
    p.add_argument("--data", metavar="SPEC", help="fields runs: held-out pairs to score on, e.g. npz:HELDOUT "
                   "(default: new built-in pairs, or rows of the training data, which eval then says)")
    p.add_argument("--max-episode-steps", type=int, metavar="N",
                   help="cut rollouts off after N environment steps (default: the environment's; pusht 300)")
    _device_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.set_defaults(func=cmd_eval)

    p = verb(sub, "presets", "list the model presets", "diffscale presets")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    p.set_defaults(func=cmd_presets)

    p = verb(sub, "report", "write one self-contained HTML page about a run (curves, samples, config, jobs, system)",
             "diffscale report runs/tiny && xdg-open runs/tiny/report.html")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (local or submitted)")
    p.add_argument("--out", help="HTML file to write (default RUN_DIR/report.html)")
    p.set_defaults(func=cmd_report)

    p = verb(sub, "env", "print a Markdown report of this machine: GPUs, topology, CPU, RAM, job, versions",
             "diffscale env > system.md   # attach it to a question or an issue")
    p.add_argument("--json", action="store_true", help="print one JSON object (sections of rows) instead")
    p.set_defaults(func=cmd_env)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = verb(sub, "export", "export a run's EMA weights and a model card (images: a diffusers.DDPMPipeline folder)",
             "diffscale export runs/emnist --diffusers hf/emnist-ddpm --license mit --push-to-hub my-lab/emnist-ddpm")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a trained run (the --out of diffscale train)")
    p.add_argument("--diffusers", metavar="OUT_DIR", help="a new or empty folder")
    p.add_argument("--license", metavar="ID", help="the weights' licence as the Hub names it, e.g. mit or apache-2.0 "
                   "(default: the card says the licence is not stated)")
    p.add_argument("--push-to-hub", metavar="REPO", help="also upload the folder to this Hugging Face Hub repo "
                   "(OWNER/NAME; created if missing); the token: HF_TOKEN, `hf auth login`'s, or --token-file")
    p.add_argument("--private", action="store_true",
                   help="create the Hub repo private (a repo that exists keeps its visibility)")
    p.add_argument("--token-file", metavar="FILE", help="a file holding the Hub token")
    p.set_defaults(func=cmd_export)


def _register_optional(sub: argparse._SubParsersAction) -> None:
    """Verbs owned by other modules (cluster, bench, doctor, sweep) register themselves. An import that
    fails is a broken install, not an optional verb: it fails loudly instead of dropping the verb."""
    import importlib

    for module in ("diffscale.cluster.cli", "diffscale.bench.cli", "diffscale.doctor", "diffscale.studies.cli"):
        importlib.import_module(module).register(sub)


def main(argv: list[str] | None = None) -> int:
    outlive_readers()
    fast_start()  # bytecode and the packages' map kept: before anything imports torch or diffusers
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["train"]  # the demo: `diffscale` alone trains the CPU preset
    parser = build_parser(argv[0])
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USER_ERROR
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # what the system refused (disk full, permission denied) that no check foresaw
        said = refused(exc)
        if said is None:
            raise
        print(f"error: {said.message}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
