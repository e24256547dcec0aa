"""``python -m benchmarks.gpu plan | prepare SLICE | run SLICE | ingest DIR``."""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.gpu import campaign, ledger, limits, runner


def plan(args) -> None:
    lines = ledger.read(args.ledger or runner.default_ledger())
    print(f"ledger: {len(lines)} runs ({args.ledger or runner.default_ledger()})")
    for name in campaign.ORDER:
        if name in campaign.NOT_BUILT:
            print(f"  {name:15s} not built yet: {campaign.NOT_BUILT[name]}")
            continue
        mod = campaign.slice_module(name)
        recipe = mod.recipe(args.dry_run)
        done = ledger.recorded_keys(lines, name, campaign.digest(recipe))
        todo = campaign.pending(name, recipe, done)
        why = getattr(mod, "blocked", lambda r: None)(recipe)
        print(f"  {name:15s} recipe {campaign.digest(recipe)}: {len(done)} recorded, "
              f"{len(todo)} pending; carries {', '.join(mod.ARCHIVES) or 'no data'}"
              + (f"; blocked: {why}" if why else ""))
    nxt = campaign.next_slice(lines, args.dry_run)
    if nxt is None:
        print("every slice of the campaign is recorded")
        return
    call = campaign.call_plan(lines, args.dry_run, limits.CALL_SECONDS - 30)
    if call and call[0][0] != nxt and not getattr(campaign.slice_module(nxt), "blocked",
                                                   lambda r: None)(
            campaign.slice_module(nxt).recipe(args.dry_run)):
        print(f"({nxt}'s pending keys wait for a later call: {call[0][0]} needs a whole call)")
        nxt = call[0][0]
    print(f"next: {nxt}")
    source = args.shared_data or os.path.join(os.path.dirname(runner.ROOT), "shared", "data")

    def data_bytes(names):
        archives = [a for n in names for a in campaign.slice_module(n).ARCHIVES]
        return sum(os.path.getsize(os.path.join(source, a)) for a in archives
                   if os.path.exists(os.path.join(source, a)))

    tree = runner.travelling_bytes()
    if not call or call[0][0] != nxt:  # (the next slice is blocked: plan names why above)
        call = [(nxt, limits.CALL_SECONDS - 30)]
    if len(call) > 1 and tree + data_bytes(n for n, _ in call) > limits.CARRY_BYTES:
        call = call[:1]
    names = [n for n, _ in call]
    data = data_bytes(names)
    print(f"size: tree {tree / limits.MIB:.1f} MiB + data {data / limits.MIB:.1f} MiB = "
          f"{(tree + data) / limits.MIB:.1f} of {limits.CARRY_BYTES // limits.MIB} MiB")
    if len(call) == 1:
        print(f"then: python -m benchmarks.gpu prepare {nxt}, and one device call:\n"
              f"  command: {runner.device_command(nxt)}\n"
              f"  carry: [\"{runner.CARRY}\"], timeout_s: {limits.CALL_SECONDS}\n"
              f"then: python -m benchmarks.gpu ingest <the call's files folder>")
        return
    carries = [runner.CARRY] + [f"{runner.CARRY}-{i + 1}" for i in range(1, len(call))]
    print(f"{nxt} needs about {call[0][1]:.0f} s: {', '.join(names[1:])} shares the call")
    print("then: " + "; ".join(f"python -m benchmarks.gpu prepare {n} --carry {c}"
                               for n, c in zip(names, carries)) + ", and one device call:\n"
          f"  command: {runner.chained_command(call, carries)}\n"
          f"  carry: {json.dumps(carries)}, timeout_s: {limits.CALL_SECONDS}\n"
          "then: " + "; ".join(f"python -m benchmarks.gpu ingest <files folder>/{n}"
                               for n in names))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu",
                                     description="The GPU campaign in short allocations.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="the campaign's state and the next pending slice")
    p.add_argument("--ledger")
    p.add_argument("--shared-data", help="the project's data folder (default ../shared/data)")
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("prepare", help="CPU machine: fill the carry folder for SLICE")
    p.add_argument("slice")
    p.add_argument("--carry", default=runner.CARRY)
    p.add_argument("--shared-data", help="the project's data folder (default ../shared/data)")
    p.add_argument("--ledger")
    p.add_argument("--dry-run", action="store_true",
                   help="toy data and toy sizes, to rehearse on the CPU")
    p = sub.add_parser("run", help="GPU machine: run the prepared SLICE within --budget-s")
    p.add_argument("slice")
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--carry", default=runner.CARRY)
    p.add_argument("--out", help="the folder that comes back (default $OUT)")
    p.add_argument("--work", help="scratch folder (default: a new temporary one)")
    p.add_argument("--dry-run", action="store_true")
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
    p = sub.add_parser("_item")  # (internal: one run in its own process)
    p.add_argument("context")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            plan(args)
        elif args.command == "prepare":
            runner.prepare(args.slice, args.carry, args.shared_data, args.ledger, args.dry_run)
            print(f"device call: command {json.dumps(runner.device_command(args.slice, carry=args.carry))}"
                  f", carry [\"{args.carry}\"], timeout_s {limits.CALL_SECONDS}")
        elif args.command == "run":
            runner.run(args.slice, args.budget_s, args.carry, args.out, args.dry_run, args.work)
        elif args.command == "ingest":
            from benchmarks.gpu.ingest import ingest

            ingest(args.folder, args.ledger, args.results_dir, args.releases_root, args.dry_run,
                   salvage=args.salvage, shared_data=args.shared_data)
        else:
            runner.run_item(args.context)
    except (ValueError, OSError) as err:
        if os.environ.get("GLOMO_TRACEBACK"):
            raise
        sys.exit(f"benchmarks.gpu {args.command}: {err}")


if __name__ == "__main__":
    main()
