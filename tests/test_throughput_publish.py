"""Issue 22 (runtime throughput, start-up): the private key read without
cryptography's serialization module."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from p2p._errors import IdentityError
from p2p._identity import _ed25519_pem_seed, _load_private_key, _pem


def test_a_private_key_reads_back_without_the_serialization_module(tmp_path: Path) -> None:
    """The PEM files the library writes are read by the direct parser (same key);
    anything else goes to cryptography's, which still names what is wrong."""
    for _ in range(20):
        key = Ed25519PrivateKey.generate()
        pem = _pem(key)
        fast = _ed25519_pem_seed(pem)
        assert fast is not None
        assert fast.private_bytes_raw() == key.private_bytes_raw()
        path = tmp_path / "key.pem"
        path.write_bytes(pem)
        path.chmod(0o600)  # the loader refuses a key others can read
        assert _load_private_key(path).private_bytes_raw() == key.private_bytes_raw()
    crlf = pem.replace(b"\n", b"\r\n")  # another layout: cryptography's parser reads it
    assert _ed25519_pem_seed(crlf) is None
    path.write_bytes(crlf)
    assert _load_private_key(path).private_bytes_raw() == key.private_bytes_raw()
    broken = pem.replace(b"MC4C", b"MC4D")
    assert _ed25519_pem_seed(broken) is None
    path.write_bytes(broken)
    with pytest.raises(IdentityError, match="corrupt"):
        _load_private_key(path)
