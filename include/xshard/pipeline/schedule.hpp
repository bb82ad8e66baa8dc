#pragma once
/// \file
/// Pipeline schedules as tables: for p stages (ranks along the pipeline axis), m
/// micro-batches and v virtual stages per rank, each rank's ordered list of actions (see
/// action.hpp). One constexpr function computes them, at compile time for a static_assert
/// or at run time for the sizes `mpirun` gives; misuse throws `xshard::error` at run time,
/// which in a constant expression is a compile error pointing at the sentence.

#include <xshard/pipeline/action.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace xshard::pipeline {

/// The sizes of a schedule: `stages` p (ranks along the pipeline axis), `micro_batches` m,
/// `virtual_stages` v (model chunks per rank; more than 1 only for the interleaved schedule).
struct schedule_config {
    schedule_kind kind = schedule_kind::one_f_one_b;
    int stages = 1;
    int micro_batches = 1;
    int virtual_stages = 1;

    /// The number of virtual stages, p v.
    constexpr int total_stages() const noexcept { return stages * virtual_stages; }
    /// The rank virtual stage `s` runs on: s mod p (Megatron's round-robin placement).
    constexpr int rank_of_stage(int s) const noexcept { return s % stages; }

    friend constexpr bool operator==(const schedule_config&, const schedule_config&) = default;
};

/// Throws `xshard::error` (a compile error in a constant expression) unless `c` is a valid
/// configuration: p, m, v at least 1 (and at most 2^16, 2^20, 64), v > 1 only for the
/// interleaved schedule, and for it m a multiple of p (its micro-batches go round in
/// groups of p).
constexpr void check(const schedule_config& c) {
    using detail::concat, detail::decimal;
    if (c.stages < 1 || c.stages > (1 << 16))
        throw error(
            concat("xshard: a pipeline needs between 1 and 65536 stages, not ", decimal(c.stages)));
    if (c.micro_batches < 1 || c.micro_batches > (1 << 20))
        throw error(concat("xshard: a pipeline needs between 1 and 2^20 micro-batches, not ",
                           decimal(c.micro_batches)));
    if (c.virtual_stages < 1 || c.virtual_stages > 64)
        throw error(
            concat("xshard: a pipeline needs between 1 and 64 virtual stages per rank, not ",
                   decimal(c.virtual_stages)));
    if (c.virtual_stages > 1 && c.kind != schedule_kind::interleaved)
        throw error(concat("xshard: virtual stages (", decimal(c.virtual_stages),
                           " per rank) need the interleaved schedule, not ", name(c.kind)));
    if (c.kind == schedule_kind::interleaved && c.micro_batches % c.stages != 0)
        throw error(concat("xshard: the interleaved schedule needs the micro-batches (",
                           decimal(c.micro_batches), ") to be a multiple of the stages (",
                           decimal(c.stages), ")"));
}

/// Every rank's ordered actions for one training step.
struct schedule {
    schedule_config config;
    /// ranks[r]: rank r's actions in the order it runs them.
    std::vector<std::vector<action>> ranks;

    /// Whether the backward pass is split into input (B) and weight (W) gradients.
    constexpr bool split_backward() const noexcept {
        return config.kind == schedule_kind::zero_bubble;
    }
};

namespace detail {

/// Fills in the transfers an action implies (see `action`).
constexpr action with_transfers(const schedule_config& c, pass kind, int mb, int s) {
    action a{kind, mb, s, -1, -1};
    const int last = c.total_stages() - 1;
    if (kind == pass::forward) {
        a.recv_from = s > 0 ? c.rank_of_stage(s - 1) : -1;
        a.send_to = s < last ? c.rank_of_stage(s + 1) : -1;
    } else if (kind != pass::backward_weight) {
        a.recv_from = s < last ? c.rank_of_stage(s + 1) : -1;
        a.send_to = s > 0 ? c.rank_of_stage(s - 1) : -1;
    }
    return a;
}

constexpr std::vector<action> gpipe_rank(const schedule_config& c, int r) {
    std::vector<action> out;
    for (int i = 0; i < c.micro_batches; ++i)
        out.push_back(with_transfers(c, pass::forward, i, r));
    for (int i = 0; i < c.micro_batches; ++i)
        out.push_back(with_transfers(c, pass::backward, i, r));
    return out;
}

/// 1F1B: p - r - 1 forwards to fill the pipeline, then one forward, one backward, then the
/// remaining backwards. At most p - r micro-batches are in flight on rank r.
constexpr std::vector<action> one_f_one_b_rank(const schedule_config& c, int r) {
    std::vector<action> out;
    const int m = c.micro_batches;
    const int warmup = std::min(c.stages - r - 1, m);
    for (int i = 0; i < warmup; ++i)
        out.push_back(with_transfers(c, pass::forward, i, r));
    for (int i = 0; i < m - warmup; ++i) {
        out.push_back(with_transfers(c, pass::forward, warmup + i, r));
        out.push_back(with_transfers(c, pass::backward, i, r));
    }
    for (int i = m - warmup; i < m; ++i)
        out.push_back(with_transfers(c, pass::backward, i, r));
    return out;
}

/// Interleaved 1F1B (Narayanan et al. 2021): rank r's k-th forward is micro-batch
/// (k / pv) p + k mod p on its chunk (k mod pv) / p, its k-th backward the same
/// micro-batch on chunk v - 1 - (k mod pv) / p; (p - r - 1) 2 + (v - 1) p forwards of
/// warm-up, then one forward, one backward.
constexpr std::vector<action> interleaved_rank(const schedule_config& c, int r) {
    std::vector<action> out;
    const int p = c.stages, v = c.virtual_stages, total = c.micro_batches * v;
    const auto mb = [&](int k) {
        return (k / (p * v)) * p + k % p;
    };
    const auto chunk = [&](int k, bool forward) {
        const int ch = (k % (p * v)) / p;
        return forward ? ch : v - 1 - ch;
    };
    const auto forward = [&](int k) {
        return with_transfers(c, pass::forward, mb(k), chunk(k, true) * p + r);
    };
    const auto backward = [&](int k) {
        return with_transfers(c, pass::backward, mb(k), chunk(k, false) * p + r);
    };
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k)
        out.push_back(forward(k));
    for (int k = 0; k < total - warmup; ++k) {
        out.push_back(forward(warmup + k));
        out.push_back(backward(k));
    }
    for (int k = total - warmup; k < total; ++k)
        out.push_back(backward(k));
    return out;
}

/// ZB-H1: the order a greedy list scheduler gives with unit-time F, B and W and 1F1B's
/// bound on the critical path (at most p micro-batches between their F and their B on any
/// rank): a rank runs the next input gradient B when its output gradient is there, else a
/// weight gradient W if p of them wait, else the next forward when its input is there and
/// the bound allows, else a deferred W. Its bubble is (p - 1) / (3m + p - 1) for m >= p, a
/// third of 1F1B's; the deferred W keep their inputs, so fewer than 2p micro-batches are
/// between their F and their W.
constexpr std::vector<std::vector<action>> zero_bubble_ranks(const schedule_config& c) {
    const int p = c.stages, m = c.micro_batches;
    constexpr int never = -1;
    // Finish times (-1: not yet) of F and B per (rank, micro-batch).
    std::vector<std::vector<int>> f_done(p, std::vector<int>(m, never)),
        b_done(p, std::vector<int>(m, never));
    std::vector<int> next_f(p, 0), next_b(p, 0), next_w(p, 0);
    std::vector<std::vector<action>> out(p);
    const auto ready = [](int done, int t) {
        return done != never && done <= t;
    };
    for (int t = 0; std::any_of(next_w.begin(), next_w.end(), [&](int w) { return w < m; }); ++t) {
        for (int r = 0; r < p; ++r) {
            const int b = next_b[r], f = next_f[r], w = next_w[r];
            if (b < f && ready(f_done[r][b], t) && (r == p - 1 || ready(b_done[r + 1][b], t))) {
                out[r].push_back(with_transfers(c, pass::backward_input, b, r));
                b_done[r][b] = t + 1;
                ++next_b[r];
            } else if (w < b && b - w >= p) {
                out[r].push_back(with_transfers(c, pass::backward_weight, w, r));
                ++next_w[r];
            } else if (f < m && (r == 0 || ready(f_done[r - 1][f], t)) && f - b < p) {
                out[r].push_back(with_transfers(c, pass::forward, f, r));
                f_done[r][f] = t + 1;
                ++next_f[r];
            } else if (w < b) {
                out[r].push_back(with_transfers(c, pass::backward_weight, w, r));
                ++next_w[r];
            }
        }
    }
    return out;
}

} // namespace detail

/// The schedule of `c` (checked by `check` first). Deterministic: every rank computes every
/// rank's list alike, without communication.
constexpr schedule make_schedule(const schedule_config& c) {
    check(c);
    schedule s{c, {}};
    if (c.kind == schedule_kind::zero_bubble) {
        s.ranks = detail::zero_bubble_ranks(c);
        return s;
    }
    for (int r = 0; r < c.stages; ++r) {
        switch (c.kind) {
        case schedule_kind::gpipe:
            s.ranks.push_back(detail::gpipe_rank(c, r));
            break;
        case schedule_kind::interleaved:
            s.ranks.push_back(detail::interleaved_rank(c, r));
            break;
        default:
            s.ranks.push_back(detail::one_f_one_b_rank(c, r));
            break;
        }
    }
    return s;
}

/// The forward passes of `c` alone, for inference (a pipelined predict or evaluation): rank
/// r runs micro-batch 0 on each of its virtual stages (r, r + p, ...) in turn, then
/// micro-batch 1, and so on. Deadlock-free by construction: every pass waits only for a pass
/// earlier in (micro-batch, stage) order, which its rank has reached already (the receives
/// are posted ahead and the sends do not block). Checked by `check` first, as a schedule of
/// one virtual stage per rank (the forward passes need no multiple of p micro-batches).
constexpr schedule make_forward_schedule(const schedule_config& c) {
    check({schedule_kind::gpipe, c.stages, c.micro_batches, 1});
    check({schedule_kind::interleaved, 1, 1, c.virtual_stages}); // v's range alone
    schedule s{c, std::vector<std::vector<action>>(std::size_t(c.stages))};
    for (int r = 0; r < c.stages; ++r)
        for (int mb = 0; mb < c.micro_batches; ++mb)
            for (int chunk = 0; chunk < c.virtual_stages; ++chunk)
                s.ranks[std::size_t(r)].push_back(
                    detail::with_transfers(c, pass::forward, mb, chunk * c.stages + r));
    return s;
}

} // namespace xshard::pipeline
