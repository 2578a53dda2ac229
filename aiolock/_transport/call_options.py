"""`CallOptions`: how one script call is made, given to `Backend.run` as one object.

A quorum's backend (`_transport.quorum`) takes the same object, decides the call by the rule
it names (`votes`), and gives each node the options of its own call.
"""

from __future__ import annotations

from typing import NamedTuple

from .._model.quorum_rules import Rule
from .base import Sent

__all__ = ("CallOptions",)


class CallOptions(NamedTuple):
    """The options of one script call (`Backend.run`), given by keyword. (A named tuple: as
    immutable as a frozen dataclass, and made in a third of its time, twice per lock cycle.)

    - `timeout`: the bound of the whole call, retries included (seconds);
    - `operation`, `name`: what the call is, for errors ("acquire", the primitive's name);
    - `background`: on aiolock's own connections (renewals), never the user's pool;
    - `fresh`: on a connection of its own, closed after (the user's connections may belong
      to another event loop); with a cluster client, to the node serving the first key;
    - `again_apart`: a call sent again after a broken connection (or an EVAL after a
      NOSCRIPT) goes on a connection of its own, closed after (a call that may outlive its
      caller);
    - `on_sent`: called once the command has been written (possibly twice, if sent again);
    - `wait`: `(replicas, ms)`, a `WAIT` sent right after the script on the same connection
      (`ms` at least 1, well within `timeout`); the reply is then `(reply, acknowledged)`;
    - `by_text`: sent as EVAL with its text (runs on a server that does not know it yet);
    - `grace`: while a cluster slot migrates, a try in flight at the bound may end first
      (False: the call ends at its bound);
    - `votes`: the rule that decides the call on a quorum of servers (a Redlock's:
      `_model.quorum_rules`); a backend of one client does without it.
    """

    timeout: float
    operation: str
    name: str | None
    background: bool = False
    fresh: bool = False
    again_apart: bool = False
    on_sent: Sent = None
    wait: tuple[int, int] | None = None
    by_text: bool = False
    grace: bool = True
    votes: Rule | None = None
