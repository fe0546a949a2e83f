"""The coupled layout: a simulation on CPU nodes hands its output to a trainer on a GPU.

``diffscale plan/submit --couple SPOOL_DIR[:N] [--preset P] [CONFIG.yaml] -- SIM COMMAND`` (the
config, if any, right before ``--``) plans two jobs in one run directory:

* the simulation: the command after ``--``, started by srun once per rank like any user
  command, on ``--sim-partition`` (``--sim-nodes`` x ``--sim-procs-per-node`` CPU ranks), with
  ``DIFFSCALE_SPOOL`` exported: the directory its ``SpoolWriter`` writes;
* the trainer: ``diffscale train`` of the config with ``data.source: spool:SPOOL_DIR:N``, on
  ``--partition`` with ``--gpus-per-node`` GPUs (default 1), resumable like any diffscale run.

SLURM holds the trainer until the simulation has started (``--dependency=after:``), so no
GPU is allocated while the simulation still queues; from then on the trainer waits for the
spool to fill, saying so in its log. Grid Engine cannot hold a job until another starts
(``-hold_jid`` waits for its end), so there both jobs are submitted on their own.

The trainer ends with the simulation, however it ends: the simulation's script writes the end
marker when the command ends by itself, and ``submit`` writes the simulation's job id into the
spool, so the trainer asks the scheduler how the job ended when it was cancelled, killed at its
time limit or lost with its node (``tasks/fields/source.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from diffscale.cluster.planning.plan import Plan, PlanOptions, make_plan
from diffscale.cluster.planning.shape import Shape, check_job_size
from diffscale.cluster.planning.workload import DiffscaleRun, UserCommand
from diffscale.cluster.profiles.types import ClusterProfile, SchedulerKind
from diffscale.cluster.scripts.timefmt import hms, human
from diffscale.config import ConfigSources, RunConfig, resolve_config
from diffscale.data.locations import SPOOL_END_NAME, SpoolSpec, parse_spool_spec
from diffscale.errors import UserError

SPOOL_ENV = "DIFFSCALE_SPOOL"
"""The variable that tells the simulation where to write (``SpoolWriter(os.environ[SPOOL_ENV])``)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--couple", metavar="SPOOL_DIR[:N]",
                   help="two jobs: the command after `--` is a simulation writing SPOOL_DIR (exported to it as "
                        f"${SPOOL_ENV}), and the config (right before `--`) or --preset trains on it with a buffer "
                        "of the newest N samples; the trainer starts once the simulation has started")
    p.add_argument("--sim-partition", help="--couple: the simulation's partition (default: the profile's only CPU one)")
    p.add_argument("--sim-nodes", type=int, default=1, help="--couple: the simulation's nodes (default 1)")
    p.add_argument("--sim-procs-per-node", type=int, default=1,
                   help="--couple: simulation ranks per node, each started by srun (default 1)")
    p.add_argument("--sim-cpus-per-task", type=int,
                   help="--couple: CPU cores per simulation rank (default: the node's cores shared, at most 8)")
    p.add_argument("--sim-time", help="--couple: the simulation's wall time (default: its partition's maximum)")


def split_targets(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    """(trainer config file or None, simulation command) from ``[CONFIG.yaml] -- COMMAND``."""
    target = list(args.target)
    config = target.pop(0) if len(target) > 1 and target[0].endswith((".yaml", ".yml")) else None
    if not target:
        raise UserError("--couple needs the simulation's command after `--`",
                        "write e.g. diffscale submit --couple SPOOL_DIR --preset field-icon -- ./simulation ARGS")
    if config is None and not args.preset:
        raise UserError("--couple needs the trainer's config: a CONFIG.yaml right before `--`, or --preset NAME",
                        "write e.g. diffscale submit --couple SPOOL_DIR --preset field-icon -- ./simulation")
    if args.race:
        raise UserError("--race and --couple cannot be combined", "race the trainer on its own, or couple one shape")
    if args.data:
        raise UserError("--data and --couple cannot be combined: the trainer reads the spool --couple names",
                        "drop --data")
    return config, tuple(target)


def trainer_config(args: argparse.Namespace, config_file: str | None) -> tuple[RunConfig, SpoolSpec]:
    """The trainer's config, following the spool ``--couple`` names (absolute: the jobs run elsewhere)."""
    def sources(**fixed: dict[str, str]) -> ConfigSources:
        return ConfigSources(preset=args.preset, config_file=config_file, overrides=args.overrides or [], fixed=fixed)

    first = resolve_config(sources())
    try:
        asked = parse_spool_spec(f"spool:{args.couple}")
    except UserError as exc:
        raise UserError(f"--couple '{args.couple}' is not a spool directory",
                        "write --couple SPOOL_DIR or SPOOL_DIR:N, N the samples the trainer's buffer keeps "
                        "(e.g. --couple /scratch/run/spool:3840)") from exc
    has_n = args.couple.rpartition(":")[2].isdigit()
    if not has_n and first.data.source.startswith("spool:"):  # keep the config's buffer size
        asked = SpoolSpec(asked.directory, parse_spool_spec(first.data.source).capacity)
    spool = SpoolSpec(Path(asked.directory).expanduser().absolute(), asked.capacity)
    cfg = resolve_config(sources(data={"source": spool.source}))
    return cfg, spool


def _sim_partition(profile: ClusterProfile, name: str | None) -> str:
    if name:
        return name
    cpu = [p.name for p in profile.partitions if not p.has_gpus]
    if len(cpu) == 1:
        return cpu[0]
    which = f"its CPU partitions are {', '.join(cpu)}" if cpu else "it has no CPU-only partition"
    raise UserError(f"which partition should the simulation run on? cluster '{profile.name}': {which}",
                    "pass --sim-partition NAME (see `diffscale cluster show " + profile.name + "`)")


def from_args(profile: ClusterProfile, args: argparse.Namespace, run_dir: Path, trainer: Shape,
              sim_time_s: int | None, options: PlanOptions) -> tuple[list[Plan], RunConfig, str]:
    """The coupled plans of ``plan/submit --couple``, the trainer's config and what runs (one line)."""
    config_file, command = split_targets(args)
    check_job_size(args.sim_nodes, args.sim_procs_per_node, gpus=False, nodes_flag="--sim-nodes",
                   per_node_flag="--sim-procs-per-node")
    cfg, spool = trainer_config(args, config_file)
    sim = Shape(nodes=args.sim_nodes, ranks_per_node=args.sim_procs_per_node,
                partition=_sim_partition(profile, args.sim_partition), time_s=sim_time_s,
                cpus_per_rank=args.sim_cpus_per_task, use_gpus=False)
    plans = coupled_plans(profile, cfg, spool, command, run_dir=str(run_dir), python=args.python or sys.executable,
                          sim=sim, trainer=trainer, options=options)
    return plans, cfg, f"simulation ({' '.join(command)}) -> spool {spool.directory} -> {plans[1].workload.title}"


def coupled_plans(profile: ClusterProfile, cfg: RunConfig, spool: SpoolSpec, command: tuple[str, ...], *,
                  run_dir: str, python: str, sim: Shape, trainer: Shape, options: PlanOptions) -> list[Plan]:
    """[simulation, trainer]: ``command`` on ``sim`` writing ``spool``, and ``cfg`` (whose data
    source follows ``spool``) trained on ``trainer``, by default as long as the simulation may run."""
    # --signal is the trainer's (it checkpoints on it); the simulation's job traps none.
    sim_plan = make_plan(profile, sim, UserCommand(command, run_dir, python, env=((SPOOL_ENV, str(spool.directory)),)),
                         dataclasses.replace(options, role="simulation", signal="auto",
                                             end_marker_dir=str(spool.directory)))
    source = ""
    if trainer.time_s is None and sim_plan.spec.time_s is not None:
        sim_time, limit = sim_plan.spec.time_s, profile.partition(trainer.partition).max_time_s
        trainer = dataclasses.replace(trainer, time_s=min(sim_time, limit or sim_time))
        if trainer.time_s == sim_time:
            given = "--sim-time" if sim.time_s is not None else "its partition's maximum"
            source = f"the simulation's wall time ({given}), so the trainer can follow it to the end"
        else:
            source = f"the trainer partition's maximum (the simulation's wall time is {hms(sim_time)})"
    train_plan = make_plan(profile, trainer, DiffscaleRun(config=cfg, run_dir=run_dir, python=python),
                           dataclasses.replace(options, role="trainer"))
    sim_plan = dataclasses.replace(sim_plan, time_source=_sim_time_source(sim, sim_plan), notes=sim_plan.notes + (
        f"the simulation writes its output steps to {spool.directory} (exported as ${SPOOL_ENV}) with "
        "diffscale.online.SpoolWriter, or as numbered .npz files of the same format (tasks/fields/spool.py)",))
    train_plan = dataclasses.replace(train_plan, time_source=source, notes=train_plan.notes + (
        _jobs(profile, sim_plan, train_plan),
        f"it trains once its buffer holds {spool.capacity} samples and says 'waiting for data' in its log until "
        "then; the training-time estimate leaves that wait out",
        _stops(cfg, train_plan.estimate_s, profile.scheduler)))
    return [sim_plan, train_plan]


def _sim_time_source(sim: Shape, plan: Plan) -> str:
    """Where the simulation's wall time came from (--time is the trainer's)."""
    if sim.time_s is not None:
        return "--sim-time"
    return "its partition's maximum (diffscale cannot estimate a simulation's time; pass --sim-time)"


def _jobs(profile: ClusterProfile, sim: Plan, trainer: Plan) -> str:
    """The jobs ``submit`` sends, in order, and what holds each."""
    slurm = profile.scheduler is SchedulerKind.SLURM
    held = (" held until the simulation has started (--dependency=after:<simulation job>)" if slurm else
            " on its own (Grid Engine cannot hold a job until another starts: -hold_jid waits for its end)")
    more = trainer.job_count - 1
    if more:
        held += (f", then {more} more trainer segment{'s' if more > 1 else ''}, each held until the one before has "
                 "ended")
    elif trainer.segments:
        held += ", which requeues itself at each time limit (--no-chain)"
    return (f"submit sends {1 + trainer.job_count} jobs: the simulation ({sim.spec.script_file}), then the trainer "
            f"({trainer.spec.script_file}){held}")


def _stops(cfg: RunConfig, estimate_s: int | None, scheduler: SchedulerKind) -> str:
    """When the trainer ends: after train.steps, or once the simulation has ended, however it ends."""
    took = f" (estimated {human(estimate_s)} of training)" if estimate_s else ""
    asks = "SLURM" if scheduler is SchedulerKind.SLURM else "Grid Engine"
    return (f"the trainer stops once it has trained train.steps={cfg.train.steps} steps{took}, or once the "
            "simulation has ended, however it ends: when its command ends by itself, its script writes "
            f"{SPOOL_END_NAME} into the spool with the exit status; a cancel, its time limit or a failed node the "
            f"trainer learns from {asks}, which it asks about the simulation's job while it trains. It then trains "
            "one more pass over the final buffer and exits 0, or, after a failure (a non-zero exit status, a failed "
            "job) or with a buffer that never filled, stops with an error naming it; a later job of the trainer "
            "trains no more. What the simulation writes after train.steps is not trained on -- raise train.steps "
            "to train for longer")
