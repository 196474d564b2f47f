"""The numeric path of the real Jordan decomposition ``X = P J P^{-1}``: scipy's real Schur form.

Eigenvalues are clustered with a radius from their condition numbers, ``‖X‖_F`` and float64 eps (or
``tol``), the Schur form is reordered to isolate each cluster's invariant subspace, the cluster mean
(as accurate as the trace) is the eigenvalue, Jordan sizes come from the numerical ranks of
``(X - λI)^k`` restricted to that subspace, and the chains are built there. A cluster whose rank
sequence is not that of a nilpotent matrix is split at its widest gap and tried again
(:func:`scaled_numeric_path`, called by :func:`liepos._jordan.real_jordan`).
"""

from __future__ import annotations

import math

import numpy as np

from liepos._jordan_form import EPS, Block, JordanForm, assemble, canonical_form, normalize_chain

__all__ = ["scaled_numeric_path"]

# entries beyond 2^±500 are scaled by a power of two first: ‖X‖_F² stays finite (at 1e154 it
# overflowed and every rate was dropped)
_SCALE_FREE_EXPONENT = 500


def _canonical_parse(A: np.ndarray) -> list[Block] | None:
    """The blocks when A already is exactly a canonical real Jordan matrix (then P = I)."""
    d = A.shape[0]
    blocks: list[Block] = []
    i = 0
    while i < d:
        lam = A[i, i]
        if i + 1 < d and A[i, i + 1] > 0 and A[i + 1, i] == -A[i, i + 1] and A[i + 1, i + 1] == lam:
            om = A[i, i + 1]
            n = 1
            while (
                i + 2 * n + 1 < d
                and A[i + 2 * n - 2, i + 2 * n] == 1
                and A[i + 2 * n, i + 2 * n] == lam
                and A[i + 2 * n, i + 2 * n + 1] == om
            ):
                n += 1
            blocks.append((float(lam), float(om), n))
            i += 2 * n
        else:
            n = 1
            while i + n < d and A[i + n - 1, i + n] == 1 and A[i + n, i + n] == lam:
                n += 1
            blocks.append((float(lam), 0.0, n))
            i += n
    if np.array_equal(canonical_form(blocks), A):
        return blocks
    return None


def _real_schur_eigs(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of a real (standardised) Schur form, exact conjugate pairs, and partners."""
    d = T.shape[0]
    w = np.empty(d, dtype=complex)
    partner = np.arange(d)
    i = 0
    while i < d:
        if i + 1 < d and T[i + 1, i] != 0:
            a, b, c, e = T[i, i], T[i, i + 1], T[i + 1, i], T[i + 1, i + 1]
            re = 0.5 * (a + e)
            im = math.sqrt(abs(b)) * math.sqrt(abs(c)) if a == e else math.sqrt(
                max(-(0.25 * (a - e) ** 2 + b * c), 0.0)
            )
            w[i], w[i + 1] = complex(re, im), complex(re, -im)
            partner[i], partner[i + 1] = i + 1, i
            i += 2
        else:
            w[i] = T[i, i]
            i += 1
    return w, partner


def _eig_condition(Tc: np.ndarray) -> np.ndarray:
    """Condition number ‖x‖‖y‖/|yᴴx| of each eigenvalue of an upper-triangular matrix."""
    from scipy.linalg import LinAlgError, solve_triangular

    d = Tc.shape[0]
    kappa = np.empty(d)
    with np.errstate(all="ignore"):
        for i in range(d):
            t = Tc[i, i]
            try:
                xn2 = 1.0
                if i > 0:
                    x = solve_triangular(Tc[:i, :i] - t * np.eye(i), -Tc[:i, i], check_finite=False)
                    xn2 += float(np.vdot(x, x).real)
                yn2 = 1.0
                if i + 1 < d:
                    y = solve_triangular(
                        (Tc[i + 1:, i + 1:] - t * np.eye(d - i - 1)).conj().T,
                        -Tc[i, i + 1:].conj(), lower=True, check_finite=False,
                    )
                    yn2 += float(np.vdot(y, y).real)
                k = math.sqrt(xn2 * yn2)
            except (LinAlgError, OverflowError, ValueError):
                k = math.inf
            kappa[i] = k if math.isfinite(k) else math.inf
    return kappa


def _components(link: np.ndarray) -> list[list[int]]:
    """Connected components of the graph with adjacency ``link`` (m, m), ordered by first member."""
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(link, directed=False)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(labels.tolist()):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def _split_widest(w: np.ndarray, members: list[int]) -> list[list[int]]:
    """Single-linkage components of ``members`` with the longest spanning-tree edges removed."""
    m = len(members)
    z = w[members]
    dist = np.abs(z[:, None] - z[None, :])  # (m, m) pairwise distances
    # Prim's algorithm for the minimum spanning tree edge lengths
    in_tree = np.zeros(m, bool)
    in_tree[0] = True
    best = dist[0].copy()
    longest = 0.0
    for _ in range(m - 1):
        best_masked = np.where(in_tree, np.inf, best)
        j = int(np.argmin(best_masked))
        longest = max(longest, float(best_masked[j]))
        in_tree[j] = True
        best = np.minimum(best, dist[j])
    return [[members[k] for k in g] for g in _components(dist < longest * (1 - 1e-12))]


def _ranks(N: np.ndarray, thresholds) -> list[int] | None:
    """r_0 = m, r_k = numerical rank of N^k, until 0; None if N is not numerically nilpotent."""
    from scipy.linalg import svdvals

    m = N.shape[0]
    ranks = [m]
    Nk = np.eye(m, dtype=N.dtype)
    normN = max(float(np.linalg.norm(N, 2)) if m else 0.0, 1.0)
    for k in range(1, m + 1):
        Nk = Nk @ N
        s = svdvals(Nk, check_finite=False)
        r = int(np.sum(s > thresholds(k, normN)))
        ranks.append(r)
        if r == 0:
            break
    if ranks[-1] != 0:
        return None
    diffs = [ranks[k - 1] - ranks[k] for k in range(1, len(ranks))]
    if any(x < 0 for x in diffs) or any(diffs[k] > diffs[k - 1] for k in range(1, len(diffs))):
        return None
    return ranks


def _chains(N: np.ndarray, ranks: list[int]) -> list[np.ndarray]:
    """Jordan chains of a nilpotent N with the given rank sequence: arrays (m, k), p_1 first."""
    from scipy.linalg import svd

    m = N.shape[0]
    s = len(ranks) - 1  # index of nilpotency
    ext = ranks + [0]
    kernels: list[np.ndarray] = [np.zeros((m, 0), dtype=N.dtype)]
    Nk = np.eye(m, dtype=N.dtype)
    for k in range(1, s + 1):
        Nk = Nk @ N
        _, _, Vh = svd(Nk, check_finite=False)
        kernels.append(Vh.conj().T[:, ranks[k]:])
    heads: list[tuple[int, np.ndarray]] = []
    level: list[np.ndarray] = []  # vectors of the current level inherited from longer chains
    for k in range(s, 0, -1):
        c = (ext[k - 1] - ext[k]) - (ext[k] - ext[k + 1])
        if c > 0:
            K = kernels[k]
            W = np.concatenate(
                # the kernel and each inherited vector as an (m, 1) column
                [kernels[k - 1]] + [v[:, None] / max(np.linalg.norm(v), 1e-300) for v in level],
                axis=1,
            )
            if W.shape[1]:
                U, sv, _ = svd(W, full_matrices=False, check_finite=False)
                Q = U[:, : int(np.sum(sv > sv[0] * 1e-10))] if sv.size and sv[0] > 0 else U[:, :0]
                M = K - Q @ (Q.conj().T @ K)
            else:
                M = K
            _, _, Vh = svd(M, check_finite=False)
            new = K @ Vh.conj().T[:, :c]
            for v in new.T:
                heads.append((k, v))
                level.append(v)
        level = [N @ v for v in level]
    chains = []
    for k, x in heads:
        cols = [x]
        for _ in range(k - 1):
            cols.append(N @ cols[-1])
        chains.append(np.stack(cols[::-1], axis=1))
    return chains


def _chains_fit(N: np.ndarray, chains: list[np.ndarray], fit_tol: float) -> bool:
    """Whether ``Y S Y^{-1}`` reproduces N within ``fit_tol`` (Y: the chains, S: their shifts)."""
    Y = np.concatenate(chains, axis=1)
    S = np.zeros((Y.shape[1], Y.shape[1]))
    off = 0
    for ch in chains:
        k = ch.shape[1]
        S[off:off + k - 1, off + 1:off + k] += np.eye(k - 1)
        off += k
    E = N @ Y - Y @ S
    try:
        err = float(np.linalg.norm(np.linalg.solve(Y.T, E.T)))
    except np.linalg.LinAlgError:
        return False
    return bool(math.isfinite(err) and err <= fit_tol)


def scaled_numeric_path(A: np.ndarray, tol: float | None, noise: float) -> JordanForm:
    """The numeric path, on ``2^-k A`` with ``max|A_ij|`` in [½, 1) when the entries are beyond
    ``2^±_SCALE_FREE_EXPONENT`` (so ‖A‖² neither overflows nor underflows); the scaling is exact.

    ``A = 2^k A'`` and ``A' P' = P' J'`` give ``A P = P J`` with rates and frequencies ``2^k`` those of
    J', and each Jordan chain's j-th vector scaled by ``2^(−kj)`` (the ones above the diagonal).
    """
    peak = float(np.abs(A).max())
    k = math.frexp(peak)[1] if peak > 0.0 else 0
    if abs(k) <= _SCALE_FREE_EXPONENT:
        return _numeric_path(A, tol, noise)
    form = _numeric_path(np.ldexp(A, -k), None if tol is None else math.ldexp(tol, -k), noise)
    P = form.basis.copy()
    off = 0
    for _, freq, n in form.blocks:
        w = 2 if freq != 0 else 1  # columns per chain vector
        chain = P[:, off:off + w * n]  # (d, w·n), a view
        for j in range(1, n):
            chain[:, w * j:w * (j + 1)] = np.ldexp(chain[:, w * j:w * (j + 1)], -k * j)
        chain /= np.linalg.norm(chain, axis=0).max()
        off += w * n
    blocks = [(math.ldexp(r, k), math.ldexp(f, k), n) for r, f, n in form.blocks]
    return JordanForm(blocks, P, False, form.signs, math.ldexp(form.zero_tol, k), noise)


def _numeric_path(A: np.ndarray, tol: float | None, noise: float) -> JordanForm:
    from scipy.linalg import lapack, rsf2csf, schur

    d = A.shape[0]
    normX = float(np.linalg.norm(A))
    eta0 = EPS * normX  # rounding
    eta = noise * normX  # the assumed backward error (>= rounding)
    zero_tol_default = max(1000.0 * d * eta0, 10.0 * eta)

    # already canonical (and no tolerance to merge with): P = I
    canon = _canonical_parse(A) if tol is None else None
    if canon is not None and all(om == 0 or om > zero_tol_default for _, om, _ in canon):
        items: list = []
        off = 0
        for lam, om, n in canon:
            lam = 0.0 if abs(lam) <= zero_tol_default else lam
            width = n * (2 if om else 1)
            cols = np.eye(d)[:, off:off + width]
            items.append(((lam, om, n), cols, (int(np.sign(lam)), om != 0)))
            off += width
        return assemble(items, d, exact=False, zero_tol=zero_tol_default, noise=noise)

    T, Z = schur(A, output="real")
    w, partner = _real_schur_eigs(T)
    Tc, _ = rsf2csf(T, Z)
    kappa = _eig_condition(Tc)
    kappa = np.maximum(kappa, kappa[partner])  # λ and its conjugate have one condition number

    # --- clustering: λ_i ~ λ_j when their uncertainty discs touch
    if tol is None:
        cap = normX * max(EPS ** 0.125, noise ** (1.0 / d))
        rho = np.minimum(10.0 * kappa * eta, cap)
        floor = 64.0 * d * eta
        radius = rho[:, None] + rho[None, :] + floor  # (d, d)
    else:
        radius = np.full((d, d), tol)
    dist = np.abs(w[:, None] - w[None, :])  # (d, d) pairwise distances
    link = dist <= radius
    for i in range(d):  # a pair within the radius of the real axis is a real eigenvalue
        if partner[i] != i and 2 * abs(w[i].imag) <= (
            radius[i, partner[i]] if tol is None else 2 * tol
        ):
            link[i, partner[i]] = link[partner[i], i] = True
    clusters = _components(link)

    # a cluster's chains must reproduce its restriction B = μI + N this well (else: split it)
    fit_tol = max(math.sqrt(EPS) * normX, 10.0 * eta, 0.0 if tol is None else 10.0 * tol)

    def rank_thresholds(k: int, normN: float) -> float:
        t = 100.0 * d * k * eta * normN ** (k - 1)
        if tol is not None:
            t = max(t, tol ** k)
        return t

    items = []
    todo = [sorted(c) for c in clusters]
    seen: set[tuple[int, ...]] = set()
    while todo:
        c = todo.pop()
        key = tuple(c)
        if key in seen:
            continue
        cset = set(c)
        conj = sorted(int(partner[i]) for i in c)
        is_real = set(conj) == cset
        if not is_real:
            if np.mean(w[c].imag) < 0:  # handle each conjugate pair of clusters once, from above
                continue
            seen.add(tuple(conj))
        seen.add(key)
        select = np.zeros(d, dtype=np.int32)
        select[list(cset | set(conj))] = 1
        k_sel = int(select.sum())
        lwork = max(1, 2 * k_sel * (d - k_sel))
        ts, qs, _, _, msel, s_recip, _, info = lapack.dtrsen(
            select, T, Z, job="E", lwork=lwork, liwork=max(1, k_sel * (d - k_sel))
        )
        if info != 0 or msel != k_sel:  # pragma: no cover - LAPACK refused to separate them
            raise np.linalg.LinAlgError(
                f"real_jordan: could not separate the eigenvalues near {complex(np.mean(w[c]))} "
                f"(LAPACK trsen info={info}); try a larger tol"
            )
        Q = qs[:, :k_sel]
        B = ts[:k_sel, :k_sel]
        m = len(c)
        if is_real:
            mu: complex = float(np.trace(B)) / m
            N = B - mu * np.eye(m)
            Qs = Q
        else:
            Tb, Zb = schur(B, output="complex")
            sel = (Tb.diagonal().imag > 0).astype(np.int32)
            if int(sel.sum()) != m:
                sel = np.zeros(k_sel, np.int32)
                sel[np.argsort(-Tb.diagonal().imag)[:m]] = 1
            tb, zb, _, _, _, _, info2 = lapack.ztrsen(sel, Tb, Zb, job="N")
            if info2 != 0:  # pragma: no cover
                raise np.linalg.LinAlgError(f"real_jordan: ztrsen failed (info={info2})")
            Bs = tb[:m, :m]
            mu = complex(np.trace(Bs)) / m
            N = Bs - mu * np.eye(m)
            Qs = Q @ zb[:, :m]
        ranks = _ranks(N, rank_thresholds)
        chains = None if ranks is None else _chains(N, ranks)
        if chains is None or not _chains_fit(N, chains, fit_tol):
            # not one eigenvalue: split the cluster at its widest gap and try the parts
            parts = _split_widest(w, c) if m > 1 else [c]
            if len(parts) == 1:  # pragma: no cover - cannot happen for m > 1
                raise np.linalg.LinAlgError(f"real_jordan: cannot resolve the cluster {w[c]}")
            todo.extend(sorted(p) for p in parts)
            seen.discard(key)
            if not is_real:
                seen.discard(tuple(conj))
            continue
        # the mean of the selected eigenvalues (λ's cluster and its conjugate) is Re μ;
        # s_recip bounds its condition
        if tol is not None:
            zero_tol = tol
        else:
            cond = max(float(s_recip), 1e-300)
            zero_tol = min(
                max(1000.0 * eta0 / cond, 10.0 * eta / cond, zero_tol_default),  # ≥ 10η
                max(math.sqrt(EPS) * normX, 10.0 * eta),
            )
        rate = float(np.real(mu))
        if abs(rate) <= zero_tol:
            rate = 0.0
        freq = 0.0 if is_real else float(np.imag(mu))
        for chain in chains:
            cols = normalize_chain(Qs @ chain, not is_real)
            items.append(((rate, freq, chain.shape[1]), cols, (int(np.sign(rate)), freq != 0)))
    return assemble(items, d, exact=False, noise=noise,
                     zero_tol=tol if tol is not None else zero_tol_default)
