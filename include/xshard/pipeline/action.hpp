#pragma once
/// \file
/// The vocabulary of pipeline schedules: what a rank does at one step of a schedule (the
/// forward or backward pass of one micro-batch on one virtual stage, and the transfers that
/// pass implies) and the schedules xshard knows.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace xshard::pipeline {

namespace detail {
/// `n` in decimal (std::to_string is not constexpr in C++20).
constexpr std::string decimal(long long n) {
    char buf[24] = {};
    int i = 24;
    unsigned long long u =
        n < 0 ? 0ULL - static_cast<unsigned long long>(n) : static_cast<unsigned long long>(n);
    do
        buf[--i] = char('0' + u % 10);
    while ((u /= 10) > 0);
    if (n < 0)
        buf[--i] = '-';
    return std::string(buf + i, buf + 24);
}

/// The parts appended into one string (appending only: GCC 12 cannot prepend to a short
/// string in a constant expression).
template <class... Parts>
constexpr std::string concat(const Parts&... parts) {
    std::string s;
    ((s += parts), ...);
    return s;
}
} // namespace detail

/// The compute of one action. `backward` is the whole backward pass of a stage (input and
/// weight gradients); the zero-bubble schedules split it into `backward_input` (the
/// input gradient, on the critical path) and `backward_weight` (the weight gradient, free
/// to fill bubbles).
enum class pass : std::uint8_t { forward, backward, backward_input, backward_weight };

/// The letter a schedule table prints for a pass: F, B, B, W.
constexpr char letter(pass p) noexcept {
    switch (p) {
    case pass::forward:
        return 'F';
    case pass::backward:
    case pass::backward_input:
        return 'B';
    case pass::backward_weight:
        return 'W';
    }
    return '?';
}

/// One step of a rank's schedule: `kind` of micro-batch `micro_batch` on virtual stage
/// `stage` (0 .. p v - 1; virtual stage s runs on rank s % p). `recv_from` is the rank
/// whose transfer the pass needs first (the activation of the previous virtual stage for a
/// forward pass, the output gradient of the next for a backward one), `send_to` the rank
/// its result goes to afterwards; -1 for none (the first and last stages, weight passes).
/// A transfer between two virtual stages of the same rank is a local hand-over and counts
/// as a send and a receive too.
struct action {
    pass kind = pass::forward;
    int micro_batch = 0;
    int stage = 0;
    int recv_from = -1;
    int send_to = -1;

    friend constexpr bool operator==(const action&, const action&) = default;
};

/// The schedules: GPipe (every forward, then every backward), 1F1B (PipeDream-Flush,
/// Megatron's default: one forward, one backward in the steady state), interleaved 1F1B
/// (v virtual stages per rank, MindSpore's `interleave=True`, Megatron's virtual
/// pipeline) and ZB-H1 (the zero-bubble schedule of Qi et al. whose peak memory is 1F1B's:
/// backward split into input and weight gradients, weight gradients deferred into the
/// bubbles).
enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble };

/// The name of a schedule as the tools and MindSpore's `scheduler` option spell it: "gpipe",
/// "1f1b", "interleaved", "zero_bubble".
constexpr std::string_view name(schedule_kind k) noexcept {
    switch (k) {
    case schedule_kind::gpipe:
        return "gpipe";
    case schedule_kind::one_f_one_b:
        return "1f1b";
    case schedule_kind::interleaved:
        return "interleaved";
    case schedule_kind::zero_bubble:
        return "zero_bubble";
    }
    return "?";
}

/// The schedule called `text` (see `name`; "zbh1" and "zb" are zero_bubble too). Throws
/// `xshard::error` naming the known ones otherwise.
XSHARD_DECL schedule_kind parse_schedule(std::string_view text);

} // namespace xshard::pipeline

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/action.ipp>
#endif
