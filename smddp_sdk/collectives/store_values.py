"""Values the mesh exchanges through the rendezvous store, each proving it comes from one of the job's ranks.

Any local user who reaches torch's store can read and write its keys, so nothing read from it is acted on
before it verifies: every value carries an HMAC-SHA256 keyed from the job's secret over the store key, the
value and the rendezvous it belongs to (``bind``: a digest of every rank's greeting, fresh nonces included,
so a value copied from another group or an earlier run of the same job does not verify either). A value
that does not verify is a CollectiveError naming the key and the store on the rank that reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import torch.distributed as dist

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.specs.contract import MESH_SECRET_ENV

KEY_PREFIX = "smddp/"
MAX_VALUE_BYTES = 64 << 10  # the mesh's values are tens of bytes; a stranger's megabytes are refused unread
_SEPARATOR = " "


def store_address(store: dist.Store) -> str:
    """host:port of the TCPStore under a group's prefix stores, for messages."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return f"{store.host}:{store.port}"
    return type(store).__name__


class StoreValues:
    """The mesh's keys in one group's store (under ``smddp/``), signed on write and verified on read."""

    def __init__(self, store: dist.Store, secret: str) -> None:
        self.store = store
        self._key = hmac.new(secret.encode(), b"smddp rendezvous store values", hashlib.sha256).digest()
        self._names = hmac.new(secret.encode(), b"smddp shared memory names", hashlib.sha256).digest()
        self._rendezvous = ""

    def bind(self, rendezvous: str) -> None:
        """From now on values belong to this rendezvous (every rank's greeting, digested) and no other."""
        self._rendezvous = rendezvous

    def seal(self, key: str, value: object) -> str:
        payload = json.dumps(value, sort_keys=True, separators=(",", ":"))
        return self._mac(key, payload) + _SEPARATOR + payload

    def unseal(self, key: str, raw: bytes) -> object:
        """The value sealed under key, or CollectiveError: a stranger wrote it (or replayed another's)."""
        mac, _, payload = raw[:MAX_VALUE_BYTES + 1].decode("utf-8", "replace").partition(_SEPARATOR)
        if len(raw) > MAX_VALUE_BYTES or not hmac.compare_digest(mac.encode(), self._mac(key, payload).encode()):
            raise self.forged(key)
        return json.loads(payload)

    def set(self, key: str, value: object) -> None:
        self.store.set(KEY_PREFIX + key, self.seal(key, value))

    def get(self, key: str) -> object:
        return self.unseal(key, self.store.get(KEY_PREFIX + key))

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists (what they hold is verified when read)."""
        return self.store.check([KEY_PREFIX + key for key in keys])

    def forged(self, key: str) -> CollectiveError:
        return CollectiveError(
            f"smddp: the rendezvous store's value for {KEY_PREFIX}{key} was not written by this job's ranks (its "
            f"HMAC does not verify): another local user wrote to the rendezvous store at {store_address(self.store)}; "
            f"nothing read from it was acted on (docs/security.md#network-listeners). If no one else can reach the "
            f"store, check that every rank has the same {MESH_SECRET_ENV} (or none)"
        )

    def derive_name(self, *parts: str) -> str:
        """A name only the job's ranks can compute (keyed with the secret) for these parts of this rendezvous."""
        message = "\0".join([self._rendezvous, *parts]).encode()
        return hmac.new(self._names, message, hashlib.sha256).hexdigest()[:40]

    def _mac(self, key: str, payload: str) -> str:
        message = "\0".join([self._rendezvous, KEY_PREFIX + key, payload]).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
