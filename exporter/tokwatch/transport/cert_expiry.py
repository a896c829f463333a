"""When an endpoint's TLS certificates expire, from the DER certificates its server sent
(`ConnectionSetup.peer_chain`); parsed after the run, never while a stream is read."""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509


@dataclass(frozen=True, slots=True)
class CertExpiry:
    """Unix times: the leaf certificate's notAfter and the earliest notAfter of every certificate sent."""

    leaf_s: float
    earliest_s: float


def cert_expiry(chain: tuple[bytes, ...]) -> CertExpiry | None:
    """The expiry of a chain, leaf first; None without certificates or when the leaf cannot be parsed (a
    certificate further up that cannot be parsed is left out of `earliest`)."""
    times = []
    for i, der in enumerate(chain):
        try:
            times.append(x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp())
        except ValueError:
            if i == 0:
                return None
    return CertExpiry(times[0], min(times)) if times else None
