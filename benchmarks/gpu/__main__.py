"""``python -m benchmarks.gpu plan | prepare SLICE | run SLICE | ingest DIR``."""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.gpu import campaign, ledger, limits, runner, schedule


def _shared(args) -> str:
    return args.shared_data or os.path.join(os.path.dirname(runner.ROOT), "shared", "data")


def _slice_lines(lines, dry_run: bool) -> None:
    for name in campaign.ORDER:
        if name in campaign.NOT_BUILT:
            print(f"  {name:15s} not built yet: {campaign.NOT_BUILT[name]}")
            continue
        mod = campaign.slice_module(name)
        recipe = mod.recipe(dry_run)
        digest = campaign.recipe_digest(name, recipe)
        done = ledger.recorded_keys(lines, name, digest)
        todo = campaign.pending(name, recipe, done)
        why = getattr(mod, "blocked", lambda r: None)(recipe)
        print(f"  {name:15s} recipe {digest}: {len(done)} recorded, {len(todo)} pending; "
              f"carries {', '.join(mod.ARCHIVES) or 'no data'}"
              + (f"; blocked: {why}" if why else ""))


def _print_call(call: schedule.Call, tree: int, archive_bytes, dry_run: bool,
                lim: limits.JobLimits) -> None:
    data = sum(archive_bytes(p.slice) for p in call.parts)
    print(f"call {call.number}: timeout_s {call.timeout_s}, --budget-s {call.budget_s}; "
          f"carries tree {tree / limits.MIB:.1f} MiB + data {data / limits.MIB:.1f} MiB = "
          f"{(tree + data) / limits.MIB:.1f} of {lim.carry_bytes // limits.MIB} MiB")
    for part in call.parts:
        budget = "what is left" if part.budget_s is None else f"{part.budget_s:.0f} s"
        runs = f"{len(part.keys)} run" + ("s" if len(part.keys) > 1 else "")
        print(f"  {part.slice}: {runs} ({', '.join(part.keys[:6])}"
              f"{' ...' if len(part.keys) > 6 else ''}), about {part.seconds:.0f} s; "
              f"budget {budget}; carry {part.carry}")
    carries = [p.carry for p in call.parts]
    command = runner.chained_command([(p.slice, p.budget_s) for p in call.parts], carries,
                                     budget_s=call.budget_s, dry_run=dry_run)
    print(f"  command: {command}")
    print(f"  carry: {json.dumps(carries)}, timeout_s: {call.timeout_s}")


def _print_forecast(lines, dry_run: bool, lim: limits.JobLimits) -> None:
    allocations = schedule.forecast(lines, dry_run, lim)
    print(f"forecast at the slices' estimates ({len(allocations)} allocations of "
          f"{lim.allocation_s:.0f} s, each call running what plan gives it):")
    for number, calls in enumerate(allocations, 1):
        print(f"  allocation {number}: " + " | ".join(
            ", ".join(f"{p.slice} x{len(p.keys)}" for p in c.parts) for c in calls))
    for stage, what in ((schedule.STAGES[1], "Table 3, ResNet-18 seeds 0-4"),
                        (schedule.STAGES[3], "IMDB seeds 0-4")):
        n = schedule.answered_after(allocations, stage, lines, dry_run)
        print(f"  {what}: " + ("not within them" if n is None else
                               f"planned after allocation {n}"))


def plan(args) -> None:
    path = args.ledger or runner.default_ledger()
    lines = ledger.read(path)
    lim = limits.LIMITS
    print(f"ledger: {len(lines)} runs ({path})")
    _slice_lines(lines, args.dry_run)
    returns = args.returns or os.path.join(os.path.dirname(runner.ROOT), "shared",
                                           "gpu-returns")
    waiting = schedule.returned_folders(returns, lines)
    if waiting:
        print(f"returned call folders the ledger lacks ({returns}): ingest each first "
              "(python -m benchmarks.gpu ingest FOLDER), then plan again")
        for folder, what in waiting:
            print(f"  {folder}: {what}")
    source = _shared(args)

    def archive_bytes(name: str) -> int:
        if args.dry_run:  # (toy archives)
            return 0
        paths = [os.path.join(source, a) for a in campaign.slice_module(name).ARCHIVES]
        return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))

    tree = runner.travelling_bytes()
    calls = schedule.allocation(lines, args.dry_run, lim, warm=args.warm,
                                tree_bytes=tree, carry_bytes=archive_bytes)
    if not calls:
        print("every runnable slice of the campaign is recorded (blocked slices: above)")
        return
    print(f"next: {calls[0].parts[0].slice}")
    print(f"allocation: {lim.allocation_s:.0f} s of device time, "
          + ("a machine held already" if args.warm else f"start-up {lim.startup_s:.0f} s")
          + f"; {len(calls)} call{'s' if len(calls) > 1 else ''}, prepared now, the next "
          f"started within {lim.warm_s:.0f} s of the last one's end (else it goes cold: "
          f"a new start of {lim.startup_s:.0f} s comes out of the next call's time)")
    for call in calls:
        _print_call(call, tree, archive_bytes, args.dry_run, lim)
    print("prepare every part now: python -m benchmarks.gpu plan --prepare"
          + (" --dry-run" if args.dry_run else "") + "\nthen, after each call: "
          "python -m benchmarks.gpu ingest <the call's files folder>/<slice>, for each part")
    if args.forecast:
        _print_forecast(lines, args.dry_run, lim)
    if args.prepare:
        for call in calls:
            for part in call.parts:
                runner.prepare(part.slice, part.carry, args.shared_data, args.ledger,
                               args.dry_run, keys=part.keys)


def _add_plan(sub) -> None:
    """The ``plan`` subcommand and its options."""
    p = sub.add_parser("plan", help="the campaign's state and the next allocation's calls")
    p.add_argument("--ledger")
    p.add_argument("--shared-data", help="the project's data folder (default ../shared/data)")
    p.add_argument("--returns", help="folder of call folders returned from elsewhere "
                   "(default ../shared/gpu-returns)")
    p.add_argument("--warm", action="store_true",
                   help="a GPU machine is held already: no start-up in the allocation")
    p.add_argument("--prepare", action="store_true",
                   help="also prepare the carry folder of every part of every call")
    p.add_argument("--forecast", action="store_true",
                   help="also the allocations the whole campaign needs at its estimates")
    p.add_argument("--dry-run", action="store_true")


def _add_prepare(sub) -> None:
    """The ``prepare`` subcommand and its options."""
    p = sub.add_parser("prepare", help="CPU machine: fill the carry folder for SLICE")
    p.add_argument("slice")
    p.add_argument("--carry", default=runner.CARRY)
    p.add_argument("--shared-data", help="the project's data folder (default ../shared/data)")
    p.add_argument("--ledger")
    p.add_argument("--keys", nargs="+", help="the pending runs to carry, in the order they run "
                   "(default: every pending run, in the campaign's order)")
    p.add_argument("--dry-run", action="store_true",
                   help="toy data and toy sizes, to rehearse on the CPU")


def _add_run(sub) -> None:
    """The ``run`` subcommand and its options."""
    p = sub.add_parser("run", help="GPU machine: run the prepared SLICE within --budget-s")
    p.add_argument("slice")
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--carry", default=runner.CARRY)
    p.add_argument("--out", help="the folder that comes back (default $OUT)")
    p.add_argument("--work", help="scratch folder (default: a new temporary one)")
    p.add_argument("--dry-run", action="store_true")


def _add_ingest(sub) -> None:
    """The ``ingest`` subcommand and its options."""
    p = sub.add_parser("ingest", help="CPU machine: check a returned folder, add it to the "
                       "ledger, write releases and results")
    p.add_argument("folder")
    p.add_argument("--ledger")
    p.add_argument("--results-dir")
    p.add_argument("--releases-root")
    p.add_argument("--shared-data", help="the project's data folder (default ../shared/data), "
                   "for slices that measure at ingest")
    p.add_argument("--salvage", action="store_true",
                   help="also record failed keys whose product came back (a key killed after "
                        "saving it), marked as salvaged")
    p.add_argument("--dry-run", action="store_true")


def _parser() -> argparse.ArgumentParser:
    """The command line: ``plan``, ``prepare``, ``run``, ``ingest`` and the internal ``_item``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu",
                                     description="The GPU campaign in short allocations.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_prepare(sub)
    _add_run(sub)
    _add_ingest(sub)
    p = sub.add_parser("_item")  # (internal: one run in its own process)
    p.add_argument("context")
    return parser


def _prepare_command(args) -> None:
    """Prepare the slice, then print the device call that runs it."""
    runner.prepare(args.slice, args.carry, args.shared_data, args.ledger, args.dry_run,
                   keys=args.keys)
    command = runner.device_command(args.slice, carry=args.carry)
    print(f"device call: command {json.dumps(command)}"
          f", carry [\"{args.carry}\"], timeout_s {limits.CALL_SECONDS}")


def _dispatch(args) -> None:
    """Run the subcommand ``args.command``."""
    if args.command == "plan":
        plan(args)
    elif args.command == "prepare":
        _prepare_command(args)
    elif args.command == "run":
        runner.run(args.slice, args.budget_s, args.carry, args.out, args.dry_run, args.work)
    elif args.command == "ingest":
        from benchmarks.gpu.ingest import ingest

        ingest(args.folder, args.ledger, args.results_dir, args.releases_root, args.dry_run,
               salvage=args.salvage, shared_data=args.shared_data)
    else:
        runner.run_item(args.context)


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    try:
        _dispatch(args)
    except (ValueError, OSError) as err:
        if os.environ.get("GLOMO_TRACEBACK"):
            raise
        sys.exit(f"benchmarks.gpu {args.command}: {err}")


if __name__ == "__main__":
    main()
