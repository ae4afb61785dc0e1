"""Work fanned out to Ray actors, each loaded once, a few items queued on each so none idles;
results yielded in the order they end, the actors killed and the driver disconnected at the
end (what `eval run --cluster` and `review --cluster` share)."""

from __future__ import annotations

from typing import Callable, Iterator


def fan_out(where: str, settings, actor: type, args: Callable[[int], tuple], method: str, items: list, *,
            count: Callable[[], int], retries: int, in_flight: int) -> Iterator:
    """Connect to the cluster at `where`, start `count()` actors of class `actor` (actor j with
    `args(j)`; restarted, and its call retried, `retries` times), call `method` on each item
    (`in_flight` queued per actor) and yield each result as it ends."""
    import ray

    from ragkit.cluster.connect import connect, disconnect, placements

    if not items:
        return
    ours = connect(where, settings.cluster.connect_timeout_s)
    actors: list = []
    try:
        n = min(max(1, count()), len(items))
        cls = ray.remote(actor)  # one .options() call: Ray Client's actor class has no second one
        actors = [cls.options(max_restarts=retries, max_task_retries=retries, scheduling_strategy=where).remote(*args(j))
                  for j, where in enumerate(placements(n))]
        todo = list(reversed(items))
        pending: dict = {}  # ref -> actor index

        def submit(j: int) -> None:
            pending[getattr(actors[j], method).remote(todo.pop())] = j

        for _ in range(in_flight):
            for j in range(n):
                if todo:
                    submit(j)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                j = pending.pop(ref)
                got = ray.get(ref)
                if todo:
                    submit(j)
                yield got
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        if ours:
            disconnect()
