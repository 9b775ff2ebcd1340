"""Blocks no other request can see: cached late (a private output), or never (a request never
resent).

The plain rule caches a block in the step its last token is computed (``allocate_slots``). A
cached block's hash is seen only by: a lookup (``get_computed_blocks``, a waiting request's
chain of hashes), the blocked head's watch (``BlockPool.watch``), another block with the same
hash (``cache_blocks``: the first holder wins) and, once the block is free, its eviction.

Rule: a request's output is *private* while no other live request of the engine has its output
key (``TokenContent.output_key``) among its prompt keys. The full blocks a private request
fills while it decodes are cached when it stops being private, when its blocks are freed (it
finishes, is aborted or preempted), or at its next ``allocate_slots``, whichever comes first:
the same blocks, with the same hashes, as the plain rule; the lazy scheduler caches them in one
run (``KVCacheManager.cache_computed``).

Why nothing can tell: every token a decode computes is an output token, so the content of a
block it fills has the request's output key, and so does every hash chained after it. Another
request's block or lookup has such a hash only if its prompt has that key; while the output is
private no live request's does, and a request added later that does ends the privacy first (the
blocks are cached before its first lookup). No earlier block holds one of these hashes: request
ids are not reused in one engine (the simulator's are unique), and a preempted request's freed
blocks, which keep their hashes, hold only tokens it had computed, which its re-admission
computes again as prompt, the plain way; every block a decode fills afterwards ends past them.
Its blocks are referenced until they are freed, so none is evicted, and the caching of one
private request's blocks finds none of another's hashes, so the order of the late caching does
not matter either. ``TokenIdContent`` (real token ids, which any request may generate) has no
output key: its requests are never private.

Rule: a request that owns content (``fastpath.contract``: outside any session, its own user
message and its output) has it from ``Request.own_from`` on, and no other request's prompt
holds it (the contract raises ``ContentContractError`` on one that does). Its full blocks from
there on (past ``Request.shareable_blocks``) are not cached at all, unless it is preempted:
then all its computed blocks are cached as it frees them, and the plain rule holds for it from
then on.

Why nothing can tell: hashes chain, so no other request's block or lookup ever has the hash of
such a block; the request's own lookups come before its first admission (it holds no blocks
then) and after a preemption (they are cached by then: the same blocks with the same hashes as
the plain rule, since no other block can hold those hashes). A free block without the hash the
plain rule gives it is evicted the same way (the free queue does not look at hashes), and only
a waiting request's chain is watched (``BlockPool.watch``), which holds none of these hashes
while they are not cached. A workload that resends a request's own content breaks the
contract and is refused (``tests/test_content_contract.py``; the generators keep it:
``tests/test_workload_sessions.py::test_only_sessions_resend_content``).

``tests/test_scheduler_lazy.py`` runs the lazy scheduler against the plain one on random
workloads with sessions that resend answers before, while and after they are generated, and
one-off requests that nothing resends.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servefleet.fastpath.request import Request


class PrivateOutputs:
    """The live requests of one engine by output key, and the prompt keys of all of them."""

    __slots__ = ("_owners", "_resent")

    def __init__(self) -> None:
        self._owners: dict[Hashable, Request] = {}
        """Output key -> the live request whose output is private."""
        self._resent: dict[Hashable, int] = {}
        """Prompt key -> how many live requests' prompts have it."""

    def add(self, req: Request, may_be_private: bool = True) -> list[Request]:
        """``req`` joins the engine: it is private unless a live request resends its output
        (or ``may_be_private`` is False). Returns the private requests whose output it resends:
        they are private no longer."""
        resent, owners = self._resent, self._owners
        exposed = []
        for key in req.content.prompt_keys:
            resent[key] = resent.get(key, 0) + 1
            owner = owners.pop(key, None)
            if owner is not None:
                owner.private_output = False
                exposed.append(owner)
        key = req.content.output_key
        req.private_output = may_be_private and key is not None and key not in resent
        if req.private_output:
            owners[key] = req
        return exposed

    def remove(self, req: Request) -> None:
        """``req`` left the engine (finished or aborted)."""
        if req.private_output:
            req.private_output = False
            del self._owners[req.content.output_key]
        resent = self._resent
        for key in req.content.prompt_keys:
            n = resent[key] - 1
            if n:
                resent[key] = n
            else:
                del resent[key]
