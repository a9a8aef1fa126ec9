"""The agreement planner: from what an agent observes to the next view (docs/failover.md).

Every membership agent calls `plan` on each observation and proposes what it returns by
check-and-set; a lost CAS re-reads and plans again. The function is pure (no I/O, no clock:
`now_ms` comes in, no randomness, every iteration sorted), so agents that observe the same
propose the same view, and any agent's proposal is as good as another's.

One proposal does one of two things to the membership, never both: it removes the members
that are lost, or, when nobody is lost, it admits the nodes ready to join (only those that
share a protocol version with every member: hexmq/node_protocol.py). Either way it then
applies the planning node's own requests (in-sync changes and handovers of the partitions it
masters), takes every partition one step towards its goal placement, and says in the view what
protocol the members speak together (the highest version all support, the features all
support). docs/failover.md
("Placement", "Who changes the view") is the operator's account of the same rules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.membership.view import master_of
from hexmq.node_protocol import (
    LEGACY,
    ClusterProtocol,
    Support,
    admission_refusal,
    cluster_protocol,
)
from services.membership.goal import goal, goal_orders
from services.membership.observed import (
    REFUSED,
    SILENT,
    Discovered,
    HandoverRequest,
    InSyncRequest,
    Observed,
    PlanConfig,
    Registration,
    Request,
)

__all__ = [
    "REFUSED",
    "SILENT",
    "Discovered",
    "HandoverRequest",
    "InSyncRequest",
    "Observed",
    "Outcome",
    "PlanConfig",
    "Registration",
    "Request",
    "ViewError",
    "check_view",
    "departed_members",
    "failover_records",
    "goal",
    "lost_members",
    "lost_reasons",
    "plan",
    "refused_joiners",
    "request_outcome",
]

Outcome = Literal["done", "pending", "moot"]


class ViewError(ValueError):
    """A view breaks the table's invariants; the message names the view epoch and the field."""


@dataclass(slots=True)
class _Part:
    """One partition's row while a plan edits it; in_sync is kept in replicas' order."""

    epoch: int
    replicas: list[str]
    in_sync: set[str]
    handover_to: str

    @property
    def master(self) -> str:
        return master_of(self)

    def key(self) -> tuple[int, tuple[str, ...], frozenset[str], str]:
        return self.epoch, tuple(self.replicas), frozenset(self.in_sync), self.handover_to

    def proto(self, p: int) -> pb.PartitionAssignment:
        return pb.PartitionAssignment(
            partition=p,
            epoch=self.epoch,
            replicas=self.replicas,
            in_sync=[r for r in self.replicas if r in self.in_sync],
            handover_to=self.handover_to,
        )


def plan(
    view: pb.View | None, observed: Observed, config: PlanConfig, now_ms: int
) -> pb.View | None:
    """The view this agent proposes next (epoch = view.epoch + 1), or None: nothing to change."""
    if view is None:
        return _first_view(observed, config)
    parts = _read_table(view)
    before = [part.key() for part in parts]
    epoch = view.epoch + 1
    old_members = set(_member_ids(view))
    members = {m.node_id: m for m in view.members}
    targets = set(view.target_members)
    joining = set(view.joining)
    leaving = set(view.leaving)
    lost = lost_members(view, observed)
    departed = [] if lost else departed_members(view)
    if (lost or departed) and config.node_id not in old_members:
        # Only a member's agent removes members: one whose node is out of the view (it is
        # joining, or was removed) may be seeing a cluster it has not caught up with yet.
        return None
    # Removals and joins go in separate views, removals first: a join waits for a view in
    # which nobody is lost, so a restarted node's old incarnation always leaves before its new
    # one enters, and each view's changes have one cause.
    if lost or departed:
        for node in lost:
            del members[node]
            if node in joining and targets - {node}:
                # A joining node lost before it caught up: the placement goes back to what it
                # was before it joined (docs/failover.md, "Join").
                targets.discard(node)
            joining.discard(node)
            leaving.discard(node)
        for node in departed:
            del members[node]
            leaving.discard(node)
        if not members.keys() - leaving:
            # Nobody left to take the leavers' partitions: the leave cannot complete.
            targets |= leaving
            leaving.clear()
    else:
        for reg in _joiners(view, observed, config, now_ms):
            members[reg.node_id] = reg.member()
            if reg.leaving:
                # Back only for the offline partitions it still holds: it restores them,
                # hands them over and leaves again.
                leaving.add(reg.node_id)
                targets.discard(reg.node_id)
            elif reg.node_id not in targets:
                targets.add(reg.node_id)
                joining.add(reg.node_id)
        for node in _leavers(members, leaving, observed):
            leaving.add(node)
            targets.discard(node)
            joining.discard(node)
    _refresh_addresses(members, observed)
    orders = goal_orders(targets, members, view.partition_count, view.replication_factor)
    for p, part in enumerate(parts):
        if lost:
            _lose(part, lost, old_members, orders[p], epoch)
        elif part.master not in old_members:
            _restore(part, members, orders[p], epoch)
    for request in observed.requests:
        _apply_request(parts, request, config.node_id, members, epoch)
    rf = view.replication_factor
    eligible = members.keys() - leaving
    caught_up = set(joining)
    for p, part in enumerate(parts):
        want = _towards_goal(part, members.keys(), eligible, orders[p], rf)
        caught_up -= {n for n in want if n not in part.in_sync}
    joining -= caught_up
    new_members = [members[n] for n in sorted(members)]
    protocol = cluster_protocol(_member_supports(members, observed).values())
    if (
        new_members == list(view.members)
        and sorted(targets) == sorted(view.target_members)
        and sorted(joining) == sorted(view.joining)
        and sorted(leaving) == sorted(view.leaving)
        and all(part.key() == key for part, key in zip(parts, before, strict=True))
        and protocol == ClusterProtocol.of_view(view)
    ):
        return None
    return pb.View(
        epoch=epoch,
        partition_count=view.partition_count,
        replication_factor=rf,
        members=new_members,
        partitions=[part.proto(p) for p, part in enumerate(parts)],
        target_members=sorted(targets),
        protocol_version=protocol.version,
        features=sorted(protocol.features),
        joining=sorted(joining),
        leaving=sorted(leaving),
    )


def _member_ids(view: pb.View) -> list[str]:
    return [m.node_id for m in view.members]


def _member_supports(members: Mapping[str, pb.Member], observed: Observed) -> dict[str, Support]:
    """What each member speaks, by its registration with the incarnation the view admits
    (without one, the least: v0.2.0's)."""
    supports = {}
    for node, member in members.items():
        reg = observed.registry.get(node)
        ok = reg is not None and reg.incarnation == member.incarnation
        supports[node] = reg.protocol if reg is not None and ok else LEGACY
    return supports


def _serving(observed: Observed) -> list[Registration]:
    """Registered, serving nodes that discovery lists (every one without discovery)."""
    return sorted(
        (r for r in observed.registry.values() if r.incarnation > 0 and observed.admits(r.node_id)),
        key=lambda r: r.node_id,
    )


def _founders(serving: Sequence[Registration]) -> list[Registration]:
    """The serving nodes that share the protocol version most of them speak (on a tie, the
    highest such version): who may form the first view together."""
    best: tuple[int, int] = (0, 0)
    for r in serving:
        for version in (r.protocol.min_version, r.protocol.max_version):
            count = sum(
                1 for o in serving if o.protocol.min_version <= version <= o.protocol.max_version
            )
            best = max(best, (count, version))
    version = best[1]
    return [r for r in serving if r.protocol.min_version <= version <= r.protocol.max_version]


def refused_joiners(view: pb.View | None, observed: Observed) -> dict[str, str]:
    """Registered, serving nodes that the view does not admit because of their protocol
    versions: node -> why (for the agents' logs and `hexmq cluster status`)."""
    serving = _serving(observed)
    if view is None:
        founders = _founders(serving)
        supports = {r.node_id: r.protocol for r in founders}
        candidates = [r for r in serving if r not in founders]
    else:
        members = {m.node_id: m for m in view.members}
        supports = _member_supports(members, observed)
        candidates = [r for r in serving if r.node_id not in members]
    refused = {}
    for reg in candidates:
        why = admission_refusal(reg.protocol, supports)
        if why is not None:
            refused[reg.node_id] = why
    return refused


def _first_view(observed: Observed, config: PlanConfig) -> pb.View | None:
    """The first view, once `expect` nodes that discovery lists and that share a protocol
    version are registered and serving (expect None: every node discovery lists, or one
    without discovery): every partition placed by assign(), at epoch 1, all in sync."""
    serving = _founders(_serving(observed))
    if config.expect is not None:
        if len(serving) < config.expect:
            return None
    elif not serving or (observed.discovered is not None and observed.discovered.missing):
        return None
    ids = [r.node_id for r in serving]
    orders = goal_orders(ids, ids, config.partitions, config.rf)
    parts = []
    for p in range(config.partitions):
        replicas = list(orders[p][: config.rf])
        parts.append(_Part(1, replicas, set(replicas), ""))
    protocol = cluster_protocol(r.protocol for r in serving)
    return pb.View(
        epoch=1,
        partition_count=config.partitions,
        replication_factor=config.rf,
        members=[r.member() for r in serving],
        partitions=[part.proto(p) for p, part in enumerate(parts)],
        target_members=ids,
        protocol_version=protocol.version,
        features=sorted(protocol.features),
    )


def _live_reporters(view: pb.View, observed: Observed) -> list[str]:
    """Reports count only from view members that are registered."""
    return sorted(n for n in _member_ids(view) if n in observed.registry)


def lost_members(view: pb.View, observed: Observed) -> list[str]:
    """The members of `view` that are lost, sorted (why: `lost_reasons`)."""
    return sorted(lost_reasons(view, observed))


def lost_reasons(view: pb.View, observed: Observed) -> dict[str, str]:
    """The members of `view` that are lost, each with why (for the agents' logs).

    Lost: no registration; a registration with another incarnation (0 included: not serving,
    or restarted); reported "refused" by any live member; or reported (any kind) by more than
    half of the view's members. Only live members' reports count, never a node's own.

    Silence removes members only while more than half of the view's members stay: members
    that suspect each other (every agent stalling on a loaded host) each had a majority of
    reports, one of them the other suspect's, and one view removed two of three members by
    silence, leaving the third alone with every partition, and then that node was killed
    (make test-deploy at load 60: 246 partitions offline, no acknowledgement for 30 s). The
    suspects with the most reports go first (then by node id); the others wait for the next
    view, where the reports of the members it removed no longer count.
    """
    reporters = _live_reporters(view, observed)
    lost = {}
    silent: list[tuple[int, str, str]] = []
    for m in sorted(view.members, key=lambda m: m.node_id):
        reg = observed.registry.get(m.node_id)
        if reg is None:
            lost[m.node_id] = "not registered"
            continue
        if reg.incarnation != m.incarnation:
            lost[m.node_id] = f"registered with incarnation {reg.incarnation}, not {m.incarnation}"
            continue
        reports = {
            r: kind
            for r in reporters
            if r != m.node_id and (kind := observed.suspicions.get(r, {}).get(m.node_id))
        }
        refused = sorted(r for r, kind in reports.items() if kind == REFUSED)
        if refused:
            lost[m.node_id] = f"reported refused by {', '.join(refused)}"
        elif 2 * len(reports) > len(view.members):
            why = f"reported silent by {', '.join(sorted(reports))} of {len(view.members)} members"
            silent.append((-len(reports), m.node_id, why))
    for _, node, why in sorted(silent):
        if 2 * (len(view.members) - len(lost) - 1) > len(view.members):
            lost[node] = why
    return lost


def departed_members(view: pb.View) -> list[str]:
    """The leaving members that hold no replica any more: their leave is done, and the view
    drops them (no failover: they master nothing, and RF was restored without them)."""
    held = {r for a in view.partitions for r in a.replicas}
    members = set(_member_ids(view))
    return sorted(n for n in view.leaving if n in members and n not in held)


def _leavers(members: Mapping[str, pb.Member], leaving: set[str], observed: Observed) -> list[str]:
    """Members whose registration (with the incarnation the view admits) says they leave, in
    order, as long as one member that is not leaving would remain."""
    found = []
    staying = set(members) - leaving
    for node in sorted(staying):
        reg = observed.registry.get(node)
        if reg is None or not reg.leaving or reg.incarnation != members[node].incarnation:
            continue
        if len(staying) > 1:
            staying.discard(node)
            found.append(node)
    return found


def _joiners(
    view: pb.View, observed: Observed, config: PlanConfig, now_ms: int
) -> list[Registration]:
    """The nodes ready to join: registered and serving, listed by discovery (if any), not
    members, reported by no live member, registered (as the agent counts it: since_ms) at
    least rejoin_settle_ms, and sharing a protocol version with every member and every node
    admitted before it (in node id order) in this view; a leaving node only to finish its
    leave (it is still a target member: the view never agreed it leaving; or a partition
    still holds it: the last in-sync copy of an offline partition), and only if a member that
    is not leaving remains to take its place."""
    members = set(_member_ids(view))
    held = {r for a in view.partitions for r in a.replicas}
    targets = set(view.target_members)
    staying = members - set(view.leaving)
    reporters = _live_reporters(view, observed)
    suspected = {n for r in reporters for n in observed.suspicions.get(r, {}) if n != r}
    supports = _member_supports({m.node_id: m for m in view.members}, observed)
    joiners = []
    for node, reg in sorted(observed.registry.items()):
        if (
            reg.incarnation > 0
            and (not reg.leaving or ((node in held or node in targets) and staying))
            and node not in members
            and observed.admits(node)
            and node not in suspected
            and now_ms - reg.since_ms >= config.rejoin_settle_ms
            and admission_refusal(reg.protocol, supports) is None
        ):
            joiners.append(reg)
            supports[node] = reg.protocol
    return joiners


def _refresh_addresses(members: dict[str, pb.Member], observed: Observed) -> None:
    """A member registered with the incarnation the view admits but new addresses (its agent
    restarted elsewhere) gets them: peers dial what the view says."""
    for node in sorted(members):
        reg = observed.registry.get(node)
        if reg is not None and reg.incarnation == members[node].incarnation:
            fresh = reg.member()
            if fresh != members[node]:
                members[node] = fresh


def _first_of(order: Sequence[str], among: Collection[str]) -> str | None:
    for node in order:
        if node in among:
            return node
    return min(among, default=None)  # not in the order: only for a view made by hand


def _lose(
    part: _Part, lost: Sequence[str], old_members: set[str], order: Sequence[str], epoch: int
) -> None:
    """The lost nodes leave one partition: its master is replaced by the first in-sync member
    in goal order, or it goes offline keeping its last in-sync replicas."""
    gone = set(lost)
    if part.master not in old_members:
        # Offline already: its in-sync replicas are not members; only followers can go.
        part.replicas = [r for r in part.replicas if r not in gone or r in part.in_sync]
        return
    remaining = part.in_sync - gone
    if not remaining:
        # The lost held its last in-sync copies: keep them (and the master) to wait for.
        part.replicas = [r for r in part.replicas if r not in gone or r in part.in_sync]
        part.handover_to = ""
        return
    part.in_sync = remaining
    if part.master in gone:
        master = _first_of(order, remaining)
        assert master is not None
        part.replicas = [master] + [r for r in part.replicas if r != master and r not in gone]
        part.epoch = epoch
        part.handover_to = ""
    else:
        part.replicas = [r for r in part.replicas if r not in gone]


def _restore(
    part: _Part, members: Mapping[str, pb.Member], order: Sequence[str], epoch: int
) -> None:
    """An offline partition gets back an in-sync replica that joined: it masters it at a new
    epoch; the in-sync replicas still away are dropped (they rejoin as followers)."""
    back = [n for n in part.in_sync if n in members]
    if not back:
        return
    master = _first_of(order, back)
    assert master is not None
    part.replicas = [master] + [r for r in part.replicas if r != master and r in members]
    part.in_sync = set(back)
    part.epoch = epoch
    part.handover_to = ""


def _apply_request(
    parts: list[_Part], request: Request, node: str, members: Mapping[str, pb.Member], epoch: int
) -> None:
    """A local request counts only from the partition's master, at the partition's epoch."""
    if request.partition >= len(parts):
        return
    part = parts[request.partition]
    if part.epoch != request.epoch or part.master != node or node not in members:
        return
    if isinstance(request, InSyncRequest):
        for follower in sorted(request.add):
            wanted = request.incarnation_of(follower)
            same = follower in members and wanted in (0, members[follower].incarnation)
            if follower in part.replicas and same:
                part.in_sync.add(follower)
        # The master never leaves, so in_sync never empties.
        part.in_sync -= request.remove - {part.master}
    elif request.to != part.master and request.to in part.in_sync and request.to in members:
        part.replicas = [request.to] + [r for r in part.replicas if r != request.to]
        part.epoch = epoch
        part.handover_to = ""


def _towards_goal(
    part: _Part, members: Collection[str], eligible: Collection[str], order: Sequence[str], rf: int
) -> list[str]:
    """One step towards the goal (its first rf eligible nodes: members not leaving, in goal
    order, returned): add missing goal replicas as followers, ask for the handover to the goal
    master once it is in sync, drop surplus replicas (a leaving node's among them) once the
    goal holds in full."""
    want = [n for n in order if n in eligible][:rf]
    if part.master not in members or not want:
        return want  # offline: nothing can move until an in-sync replica is back
    part.replicas += [n for n in want if n not in part.replicas]
    head = want[0]
    part.handover_to = head if head != part.master and head in part.in_sync else ""
    if head == part.master and all(n in part.in_sync for n in want):
        part.replicas = [r for r in part.replicas if r in want]
        part.in_sync &= set(want)
    return want


def check_view(view: pb.View) -> None:
    """Raise ViewError naming the first broken invariant of `view`'s table."""
    _read_table(view)


def _read_table(view: pb.View) -> list[_Part]:
    """The view's table as rows to edit, checked on the way (ViewError names what is wrong)."""
    where = f"view {view.epoch}"
    if view.epoch < 1:
        raise ViewError(f"{where}: epoch must be positive")
    if view.replication_factor < 1:
        raise ViewError(f"{where}: replication_factor must be positive")
    if view.partition_count < 1 or len(view.partitions) != view.partition_count:
        raise ViewError(
            f"{where}: partition_count {view.partition_count} but {len(view.partitions)} partitions"
        )
    ids = _member_ids(view)
    if len(set(ids)) != len(ids) or "" in ids:
        raise ViewError(f"{where}: member ids must be unique and non-empty: {ids}")
    if not view.target_members:
        raise ViewError(f"{where}: no target_members")
    joining, leaving, targets = set(view.joining), set(view.leaving), set(view.target_members)
    if not joining <= set(ids) & targets:
        raise ViewError(f"{where}: joining {sorted(joining)} must be members and targets")
    if not leaving <= set(ids) or leaving & targets:
        raise ViewError(
            f"{where}: leaving {sorted(leaving)} must be members and not target_members"
        )
    parts = []
    for p, a in enumerate(view.partitions):
        at = f"{where}: partition {p}"
        part = _Part(a.epoch, list(a.replicas), set(a.in_sync), a.handover_to)
        if a.partition != p:
            raise ViewError(f"{at}: numbered {a.partition} (partitions must be in order)")
        if not 1 <= part.epoch <= view.epoch:
            raise ViewError(f"{at}: epoch {part.epoch} outside 1..{view.epoch}")
        if not part.replicas or len(set(part.replicas)) != len(part.replicas):
            raise ViewError(f"{at}: replicas {part.replicas} empty or repeated")
        if not part.in_sync <= set(part.replicas) or part.master not in part.in_sync:
            raise ViewError(
                f"{at}: in_sync {sorted(part.in_sync)} must hold the master and only replicas"
                f" {part.replicas}"
            )
        if part.handover_to and part.handover_to not in part.replicas:
            raise ViewError(f"{at}: handover_to {part.handover_to} is not a replica")
        parts.append(part)
    return parts


def request_outcome(request: Request, view: pb.View) -> Outcome:
    """Whether a local request holds in `view` (done), can no longer apply (moot: the
    partition's epoch moved on, this node no longer masters it, the follower is no replica...),
    or still needs proposing (pending). For a removal, done = the follower is not in in_sync.

    Judge a request against every agreed view in turn: a later view may move the partition on
    and make a request that was done look moot.
    """
    if request.partition >= len(view.partitions):
        return "moot"
    a = view.partitions[request.partition]
    members = set(_member_ids(view))
    if isinstance(request, HandoverRequest):
        if a.epoch != request.epoch:
            return "done" if master_of(a) == request.to else "moot"
        if master_of(a) not in members or request.to not in members:
            return "moot"
        return "pending" if request.to in a.in_sync and request.to != master_of(a) else "moot"
    if a.epoch != request.epoch or master_of(a) not in members:
        return "moot"
    outcomes: list[Outcome] = []
    incarnations = {m.node_id: m.incarnation for m in view.members}
    for f in sorted(request.add):
        wanted = request.incarnation_of(f)
        if wanted and f in incarnations and incarnations[f] != wanted:
            outcomes.append("moot")  # restarted since its master asked: it catches up anew
        elif f in a.in_sync:
            outcomes.append("done")
        elif f in a.replicas and f in members:
            outcomes.append("pending")
        else:
            outcomes.append("moot")
    for f in sorted(request.remove):
        if f == master_of(a):
            outcomes.append("moot")
        else:
            outcomes.append("pending" if f in a.in_sync else "done")
    if "pending" in outcomes:
        return "pending"
    return "moot" if "moot" in outcomes else "done"


def failover_records(old: pb.View, new: pb.View, now_ms: int) -> list[pb.FailoverRecord]:
    """What changed hands between two consecutive views (kinds: failover, handover, offline,
    restored), for status, logs and metrics."""
    was = set(_member_ids(old))
    now = set(_member_ids(new))
    records = []
    for a, b in zip(old.partitions, new.partitions, strict=True):
        before, after = master_of(a), master_of(b)
        if b.epoch != a.epoch:
            if before not in was:
                kind = "restored"
            elif before not in now:
                kind = "failover"
            else:
                kind = "handover"
        elif before in was and after not in now:
            kind, after = "offline", ""
        else:
            continue
        records.append(
            pb.FailoverRecord(
                partition=b.partition,
                epoch=b.epoch,
                from_node=before,
                to_node=after,
                kind=kind,
                at_ms=now_ms,
                view_epoch=new.epoch,
            )
        )
    return records
