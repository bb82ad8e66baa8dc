#pragma once
/// \file
/// The options of shard() and the mode they select. A sharded callable runs in one of five
/// modes (`shard_mode`): local semantics (shard_local), or global semantics (shard) with or
/// without each of its two options, `auto_redistribute` (the operations inside the call
/// insert the redistributions their rules need) and `sharding_propagation{level}` (the
/// `none` specs of tensor inputs are derived by trial calls, shard/derivation.hpp). A
/// `parameter_plan` lays out the parameters a call receives in either semantics.

#include <xshard/core/layout.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

namespace xshard {

/// The option that lets operations inside a global-semantics shard() insert redistributions.
struct auto_redistribute_t {};
inline constexpr auto_redistribute_t auto_redistribute{};

/// Parameter name -> layout.
using parameter_plan = std::map<std::string, layout>;

/// The option named after MindSpore's `sharding_propagation` mode: the `none` specs of
/// tensor inputs are derived, by the objective `level` (0 the least communication, 1 the
/// least memory, 2 the fastest; core/objective.hpp). See shard/derivation.hpp.
struct sharding_propagation {
    int level = 0;
};

/// How a sharded callable runs: what its callable receives and how the layouts inside the
/// call come about. The type of the callable shard() and shard_local() return carries it.
enum class shard_mode : std::uint8_t {
    /// shard(): the callable receives distributed tensors and its operations' sharding rules
    /// give every result its layout; a rule that needs a redistribution is an error.
    global,
    /// shard(..., auto_redistribute): global semantics whose operations insert the
    /// redistributions their rules need.
    global_redistributing,
    /// shard(..., sharding_propagation{level}): global semantics whose `none` input specs
    /// are derived.
    global_deriving,
    /// shard(..., auto_redistribute, sharding_propagation{level}): both options.
    global_redistributing_deriving,
    /// shard_local(): the callable receives the local shards; the output specs declare the
    /// layouts of its results.
    local,
};

namespace detail {

/// Whether the callable of mode `m` works on local shards.
constexpr bool local_semantics(shard_mode m) noexcept {
    return m == shard_mode::local;
}

/// Whether the operations inside a call of mode `m` insert the redistributions they need.
constexpr bool inserts_redistributions(shard_mode m) noexcept {
    return m == shard_mode::global_redistributing ||
           m == shard_mode::global_redistributing_deriving;
}

/// Whether a call of mode `m` derives the layouts of its `none` tensor inputs.
constexpr bool derives_layouts(shard_mode m) noexcept {
    return m == shard_mode::global_deriving || m == shard_mode::global_redistributing_deriving;
}

/// The mode of shard() (`local` false) or shard_local() with the given options.
constexpr shard_mode mode_of(bool local, bool redistributing, bool deriving) noexcept {
    if (local)
        return shard_mode::local;
    if (redistributing)
        return deriving ? shard_mode::global_redistributing_deriving
                        : shard_mode::global_redistributing;
    return deriving ? shard_mode::global_deriving : shard_mode::global;
}

template <class O>
constexpr bool is_shard_option =
    std::is_same_v<O, auto_redistribute_t> || std::is_same_v<O, parameter_plan> ||
    std::is_same_v<O, sharding_propagation>;

template <class O, class... Options>
constexpr int option_count = (0 + ... + int(std::is_same_v<O, Options>));

} // namespace detail

} // namespace xshard
