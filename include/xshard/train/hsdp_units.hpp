#pragma once
/// \file
/// The layers of a model under optimizer sharding (train/hsdp.hpp) and what is in flight for
/// each: a unit is the weights of one layer, gathered (level3), freed and reduced together.
/// hsdp::forward and hsdp::backward drive the units: a unit's all-gather starts before the
/// layer before it computes (the prefetch) and is waited for just before its own layer runs;
/// its gradient reductions start as soon as its backward is done and are waited for in
/// hsdp::synchronize_gradients.

#include <xshard/compiled.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp_entry.hpp>
#include <xshard/train/hsdp_exchange.hpp>
#include <xshard/train/hsdp_spaces.hpp>
#include <xshard/train/hsdp_timings.hpp>

#include <concepts>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace xshard {

/// Whether a model's layers can be run one at a time (nn::sequential): `layer_count` layers,
/// `get<I>()` the I-th, whose weights are named "I.<...>". hsdp::forward and hsdp::backward
/// then gather (level3) and reduce each layer's weights around that layer alone; other
/// models are one unit.
template <class M>
concept layered_model = requires(M& m) {
    { M::layer_count } -> std::convertible_to<std::size_t>;
    m.template get<0>();
};

namespace detail {

/// The weights of one layer (those whose names share the first component): gathered,
/// freed and reduced together by forward and backward.
struct hsdp_unit {
    std::string prefix;
    std::vector<std::size_t> members;             ///< sharded weights (entries)
    std::vector<std::string> allreduced;          ///< weights of the all-reduce buckets
    std::vector<hsdp_exchange> gathers, scatters; ///< one per element type and space
    bool present = false; ///< level3: the values have storage (gathered or on the way)
    bool gathering = false;
    bool scattering = false;
    bool user = false; ///< level3: materialised by gather_weights
};

/// The units of a sharded model, in the order of their first weights, and the gathers and
/// reductions in flight for them. Every operation is collective over the weights' mesh
/// where it starts or finishes an exchange; every rank calls them in the same order. The
/// entries and the timings must outlive it, kept in place.
class hsdp_units {
public:
    hsdp_units(std::vector<hsdp_entry>& entries, hsdp_timings& timings, int level);

    std::size_t size() const noexcept { return units_.size(); }
    hsdp_unit& operator[](std::size_t u) { return units_[u]; }

    /// The unit of the weights named "<prefix>.<...>", if any.
    std::optional<std::size_t> find(const std::string& prefix) const;

    /// The unit of weight `name`, made on first use.
    hsdp_unit& of_weight(const std::string& name);

    /// Plans each unit's exchanges (train/hsdp_exchange.hpp) on tags from `next_tag` on:
    /// the all-gathers, and at levels 2 and 3 the reduce-scatters.
    void plan(const hsdp_spaces& spaces, int& next_tag);

    /// With hsdp_options::overlap_allreduce: the synchronizer whose all-reduce buckets a
    /// unit's weights are made ready in, as its reductions start.
    void overlap_allreduce(gradient_synchronizer* sync) noexcept { ready_ = sync; }

    /// Level3: starts unit u's all-gather unless its values are there or on the way.
    void start_gather(std::size_t u);

    /// Level3: unit u's values, gathered.
    void ensure_gathered(std::size_t u);

    /// Level3: every unit's values gathered (all the gathers started first), and, with
    /// `grads`, their gradients given storage.
    void gather_all(bool grads);

    /// Level3: frees unit u's values, unless they are on the way or the user's.
    void release_values(std::size_t u);

    /// Level3: gives unit u's gradients storage (zero terms).
    void allocate_grads(std::size_t u);

    /// Starts unit u's gradient reductions: its reduce-scatters (levels 2 and 3, when every
    /// gradient holds its terms) and its weights' all-reduce buckets (overlap_allreduce).
    void start_reductions(std::size_t u);

    /// Starts every unit's reductions and frees its values, last unit first.
    void start_all_reductions();

    /// Waits for unit u's reduce-scatters, if started; its entries are then reduced.
    void finish_reductions(std::size_t u);

    /// Lets MPI move what is in flight (Open MPI progresses inside MPI calls only).
    void progress();

    /// Completes whatever is in flight (gathers kept, reductions dropped).
    void finish_all();

    /// Level3: every value gathered, kept (the user's) until the next forward pass.
    void materialize();

    /// Level3, before a forward pass: what the user materialised goes back into the masters
    /// (local), and is freed.
    void begin_forward();

private:
    hsdp_entry& entry(std::size_t i) { return (*entries_)[i]; }

    std::vector<hsdp_entry>* entries_;
    hsdp_timings* timings_;
    int level_;
    gradient_synchronizer* ready_ = nullptr;
    std::vector<hsdp_unit> units_;
    std::map<std::string, std::size_t> index_;
};

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/hsdp_units.ipp>
#endif
