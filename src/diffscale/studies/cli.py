"""``diffscale sweep plan|submit|run|status|collect|report``: registered by ``register(subparsers)`` the way
the cluster and bench verbs are, imported only when ``sweep`` runs. plan, status and collect load
no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffscale.errors import UserError

if TYPE_CHECKING:
    from diffscale.studies.definition import SweepDefinition
    from diffscale.studies.plan import SweepPlan

EXAMPLE_FILE = "diffscale sweep plan study.yaml"
EXAMPLE_SHORT = ("diffscale sweep plan --preset small --axis optim.lr=1e-4,3e-4 --axis train.seed=0,1,2\n"
                 "diffscale sweep plan --cluster bu-scc --gpus-per-node 1 --axis lr=1e-4,3e-4 "
                 "-- python /abs/train.py --lr {lr}")


def _definition_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="*", metavar="FILE | DIR | -- COMMAND",
                   help="a sweep YAML, a sweep directory, or (with --axis) a command with {placeholders} after --")
    p.add_argument("--preset", help="short form: train this preset in every element")
    p.add_argument("--config", help="short form: a config YAML every element starts from")
    p.add_argument("--data", metavar="SPEC", help="short form: data spec of every element")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="short form: a config field every element gets")
    p.add_argument("--axis", dest="axes", action="append", default=[], metavar="NAME=V1,V2",
                   help="short form: an axis (config field, {placeholder}, cluster.partition or cluster.shape)")
    p.add_argument("--zip", dest="zipped", action="append", default=[], metavar="NAME=V1,V2",
                   help="short form: axes varied together (equal lengths)")
    p.add_argument("--name", default="sweep", help="short form: the sweep's name (default sweep)")
    p.add_argument("--out", help="the sweep directory (default: the file's out:, else sweeps/NAME)")
    p.add_argument("--cluster", help="short form: a cluster profile to run the elements on as job arrays")
    p.add_argument("--partition", help="short form: partition")
    p.add_argument("--nodes", type=int, default=1, help="short form: nodes per element (default 1)")
    p.add_argument("--gpus-per-node", type=int, help="short form: GPUs per node of each element")
    p.add_argument("--procs-per-node", type=int, help="short form: CPU processes per node instead of GPUs")
    p.add_argument("--time", help="short form: wall time of each element's job")
    p.add_argument("--account", help="short form: SLURM --account / Grid Engine -P")
    p.add_argument("--parallel", type=int, default=0, help="short form: elements of one array at once (0: no limit)")
    p.add_argument("--cpus-per-task", type=int, help="short form: cores per rank")
    p.add_argument("--mem", help="short form: host memory per node (GiB, or 64G / 2048M)")
    p.add_argument("--max-elements", type=int, help="refuse a sweep of more elements than this (default 10000)")
    p.add_argument("--force", action="store_true", help="go ahead although any preflight check failed (this call)")
    p.add_argument("--force-check", dest="force_checks", action="append", default=[], metavar="NAME",
                   help="go ahead although the check NAME failed (as plan prints it, e.g. 'host RAM per node'); "
                        "kept in the sweep directory, so --failed honours it")


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffscale.cli_parser import verb

    p = verb(subparsers, "sweep", "studies: many runs from one definition, as job arrays or on this machine",
             f"{EXAMPLE_FILE}\ndiffscale sweep run study.yaml && diffscale sweep collect sweeps/study")
    sub = p.add_subparsers(dest="sweep_verb", metavar="{plan,submit,run,status,collect,report}")
    sub.required = True
    q = verb(sub, "plan", "the table of runs, the array script(s) and the preflight of each job shape", EXAMPLE_SHORT)
    _definition_arguments(q)
    q.set_defaults(func=cmd_plan)
    q = verb(sub, "submit", "one array job per distinct job shape", "diffscale sweep submit study.yaml\n"
             "diffscale sweep submit sweeps/study --failed")
    _definition_arguments(q)
    q.add_argument("--failed", action="store_true", help="resubmit only the failed elements of a sweep directory")
    q.set_defaults(func=cmd_submit)
    q = verb(sub, "run", "work through the elements on this machine (one at a time, or one per GPU)",
             "diffscale sweep run study.yaml --gpus auto")
    _definition_arguments(q)
    q.add_argument("--gpus", help="run one element per GPU at once: a list (0,1,2) or auto (every GPU here)")
    q.add_argument("--progress-every", type=float, default=30.0, metavar="S",
                   help="say where the running elements stand every S seconds, on stderr (0: never; default 30)")
    q.set_defaults(func=cmd_run)
    q = verb(sub, "status", "which elements are pending, running, done or failed (and why)",
             "diffscale sweep status sweeps/study")
    q.add_argument("sweep_dir", metavar="DIR", help="a sweep directory")
    q.add_argument("--json", action="store_true", help="print every element's state as one JSON list")
    q.set_defaults(func=cmd_status)
    q = verb(sub, "collect", "a table, CSV and plot of each run's final and best metrics against the axes",
             "diffscale sweep collect sweeps/study")
    q.add_argument("sweep_dir", metavar="DIR", help="a sweep directory")
    q.add_argument("--metric", default="loss", help="the metric to plot (default loss)")
    q.add_argument("--sort", metavar="COLUMN", help="rows best first by a score (fd, recall, crps, success, ...: "
                   "the way it is better) or another column of the summary (ascending)")
    q.add_argument("--json", action="store_true", help="print the summary rows as one JSON list instead of a table")
    q.set_defaults(func=cmd_collect)
    q = verb(sub, "report", "one self-contained HTML page: the runs' curves overlaid and the table of final numbers",
             "diffscale sweep report sweeps/study && xdg-open sweeps/study/report.html")
    q.add_argument("sweep_dir", metavar="DIR", help="a sweep directory")
    q.add_argument("--out", help="HTML file to write (default DIR/report.html)")
    q.add_argument("--metric", default="loss", help="the metric of the table (default loss)")
    q.set_defaults(func=cmd_report)


def load_definition(args: argparse.Namespace) -> SweepDefinition:
    """The sweep a verb's arguments name: a sweep directory, a YAML file, or the short form."""
    from diffscale.studies import definition as d
    from diffscale.studies.state import is_sweep_dir, read_definition

    target = list(args.target)
    if not (args.axes or args.zipped):
        if len(target) != 1:
            raise UserError("no sweep given", "pass a sweep YAML or directory, or use the short form: diffscale sweep "
                            "plan --preset small --axis optim.lr=1e-4,3e-4")
        path = Path(target[0])
        if path.is_dir():
            if not is_sweep_dir(path):
                raise UserError(f"'{path}' is not a sweep directory (it has no sweep.yaml / elements.json)",
                                "pass a sweep YAML, or the out: folder of a started sweep")
            if args.out and Path(args.out).absolute() != path.absolute():
                raise UserError(f"--out {args.out} with the sweep directory {path}: a started sweep stays where it is",
                                f"leave --out out, or copy the directory there first (cp -r {path} {args.out})")
            raw = read_definition(path.absolute())
        else:
            raw = d.read_file(path)
            if args.out:  # the flag wins over the file's out:
                raw = {**raw, "out": args.out}
        return d.from_dict(_with_flags(raw, args), name=path.stem if path.is_file() else path.name, source=str(path))
    cluster = None
    if args.cluster:
        cluster = {"name": args.cluster, "partition": args.partition, "nodes": args.nodes,
                   "gpus_per_node": args.gpus_per_node, "procs_per_node": args.procs_per_node, "time": args.time,
                   "account": args.account, "parallel": args.parallel, "cpus_per_task": args.cpus_per_task,
                   "mem": args.mem, "force": args.force_checks}
    elif args.force_checks:
        raise UserError("--force-check names a preflight check, but the sweep names no cluster",
                        "drop --force-check: a sweep run here has no preflight")
    return d.from_flags(d.ShortForm(name=args.name, out=args.out, preset=args.preset, config=args.config,
                                    data=args.data, overrides=args.overrides, axes=args.axes, zipped=args.zipped,
                                    command=target, cluster=cluster, max_elements=args.max_elements))


def _with_flags(raw: Any, args: argparse.Namespace) -> Any:
    """A sweep file's or directory's definition with --max-elements and --force-check added."""
    if not isinstance(raw, dict):
        return raw  # from_dict names what is wrong with it
    raw = dict(raw)
    if args.max_elements is not None:
        raw["max_elements"] = args.max_elements
    if args.force_checks:
        cluster = raw.get("cluster")
        if not isinstance(cluster, dict):
            raise UserError("--force-check names a preflight check, but the sweep names no cluster",
                            "drop --force-check: a sweep run here has no preflight")
        forced = cluster.get("force") or []
        forced = [forced] if isinstance(forced, str) else list(forced)
        raw["cluster"] = {**cluster, "force": forced + [n for n in args.force_checks if n not in forced]}
    return raw


def cmd_plan(args: argparse.Namespace) -> int:
    from diffscale.studies import tables
    from diffscale.studies.plan import plan_sweep

    plan = plan_sweep(load_definition(args), force=args.force, preview=tables.PREVIEW)
    tables.print_elements(plan)
    tables.print_arrays(plan)
    return 0


def _started(args: argparse.Namespace, *, submitting: bool = False) -> SweepPlan:
    """The sweep planned and its directory written (definition, elements, element configs)."""
    from diffscale.studies.plan import plan_sweep
    from diffscale.studies.write import write_sweep

    plan = plan_sweep(load_definition(args), force=args.force)
    if submitting and plan.profile is None:
        raise UserError(f"sweep {plan.definition.name} names no cluster to submit to",
                        "add cluster: {name: PROFILE, ...} to the sweep, or run it here: diffscale sweep run")
    for index in write_sweep(plan):
        print(f"element {index}'s run directory was gone: it is made again and runs from the start", flush=True)
    return plan


def cmd_run(args: argparse.Namespace) -> int:
    from diffscale.studies.runner import gpu_slots, run_elements

    if not 0 <= args.progress_every < float("inf"):  # before the sweep directory is written
        raise UserError(f"--progress-every {args.progress_every:g} is not a number of seconds >= 0",
                        "use e.g. 30, or 0 for no progress lines")
    slots = gpu_slots(args.gpus)
    plan = _started(args)
    return run_elements(plan, slots, progress_every=args.progress_every)


def cmd_submit(args: argparse.Namespace) -> int:
    from diffscale.studies.submit import submit_sweep

    if args.failed and not (len(args.target) == 1 and Path(args.target[0]).is_dir()):
        raise UserError("--failed resubmits the failed elements of a started sweep",
                        "pass its directory: diffscale sweep submit sweeps/NAME --failed")
    plan = _started(args, submitting=True)
    return submit_sweep(plan, failed_only=args.failed)


def cmd_status(args: argparse.Namespace) -> int:
    from diffscale.studies import tables
    from diffscale.studies.status import sweep_states

    sweep_dir = Path(args.sweep_dir)
    states = sweep_states(sweep_dir)
    if args.json:
        import json

        print(json.dumps([{"index": s.index, "values": values, "state": s.state, "reason": s.reason,
                           "exit_code": s.exit_code} for values, s in states]))
        return 0
    tables.print_status(sweep_dir, states)
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from diffscale.studies.collect import collect

    for line in collect(Path(args.sweep_dir), metric=args.metric, sort=args.sort, as_json=args.json):
        print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from diffscale.io.paths import file_target
    from diffscale.studies.report import write_sweep_report
    from diffscale.studies.state import read_elements

    read_elements(Path(args.sweep_dir))  # a sweep directory, or one error line
    out = file_target(args.out, "--out", example="report.html") if args.out else None
    print(write_sweep_report(Path(args.sweep_dir), out, metric=args.metric))
    return 0
