#pragma once
/// \file
/// One sharded weight under optimizer sharding (train/hsdp.hpp): the shard it is given (the
/// master block, the sharded gradient, the optimizer's state slots) and what the sharding
/// does with it, type-erased so that weights of every element type and rank sit in one list:
/// its planned collectives, its part in the fused exchanges, and (level3) its storage.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/batch.hpp>
#include <xshard/redistribute/plan.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace xshard::detail {

struct hsdp_entry;
struct hsdp_exchange;
class hsdp_spaces;

/// Plans one fused exchange of entries of element type T (defined in train/hsdp_exchange.hpp,
/// which includes this header).
template <class T>
hsdp_exchange plan_hsdp_exchange_of(std::vector<hsdp_entry>& entries, const hsdp_spaces& spaces,
                                    std::vector<std::size_t> members, bool gather, int tag,
                                    bool release_buffers);

/// One sharded weight's operations, type-erased.
struct hsdp_entry {
    std::function<void()> to_shard; ///< the gradient and the master block into the shard
    std::function<void()> gather;   ///< the master block back into the value
    std::function<void()> refresh;  ///< the master block from the value (local)
    std::function<void()> scale;    ///< the mean: the sharded gradient / copies
    std::function<bool()> terms;    ///< whether the gradient holds its terms
    /// Level3: the value's storage given (uninitialised) or taken; the gradient's given
    /// (zero terms), taken, or given back at destruction.
    std::function<void()> allocate_value, release_value, allocate_grad, release_grad, restore_grad;
    /// Adds the weight to a batch plan of its element type: the all-gather (true) or the
    /// reduce-scatter of its terms (false).
    std::function<void(void*, bool)> add_to;
    /// The gradient / sharded gradient, or the sharded master / value (gather), as
    /// source and destination of the batch.
    std::function<const void*(bool)> source;
    std::function<void*(bool)> destination;
    std::type_index type = typeid(void);
    /// plan_hsdp_exchange_of for the weight's element type: only the types of the weights
    /// sharded are instantiated.
    hsdp_exchange (*plan_exchange)(std::vector<hsdp_entry>&, const hsdp_spaces&,
                                   std::vector<std::size_t>, bool, int, bool) = nullptr;
    std::size_t bytes = 0;
    bool reduced = false; ///< the shard's gradient holds this step's reduction
    /// Where the shard lives (train/hsdp_spaces.hpp): 0 the weights' mesh, s > 0 a copy mesh
    /// (a split over part of an axis), whose `across_reduce` sums the reduce-scattered
    /// gradient block over the copies.
    int space = 0;
    std::function<void()> across_reduce;
};

/// The layouts a sharded weight moves between.
struct hsdp_entry_layouts {
    layout value;      ///< the weight's own, on the weights' mesh
    layout sharded;    ///< its update's, on the state mesh
    layout terms;      ///< its gradient's terms before synchronisation (weight::term_layout)
    layout copy_terms; ///< the terms as the state mesh sees them (the same pending sums)
};

/// Where a weight's shard lives and how its gradient is reduced.
template <class Mesh>
struct hsdp_entry_place {
    const Mesh* state_mesh;               ///< the weights' mesh, or this rank's copy mesh
    const communicator* across = nullptr; ///< a copy mesh's: this place in every copy
    int space = 0;                        ///< the state mesh's index (train/hsdp_spaces.hpp)
    bool level2 = false;                  ///< gradients reduce-scattered into the shards
    bool mean = false;                    ///< the sums divided by the number of copies
};

/// The planned redistributions of a weight of element type T and rank N.
template <class T, std::size_t N>
using hsdp_plan = std::shared_ptr<redistribution_plan<T, N>>;

/// Gives `w` its shard on `state_mesh`, laid out `sharded`: the master block sliced from the
/// value, a zero gradient, and the state slots the optimizer already has (a loaded
/// checkpoint's) sliced, `w.state` left empty. Plans the slice (value -> sharded) and the
/// way back (sharded -> value), returned in that order. Local.
template <class W, class Mesh>
auto give_shard(W& w, const Mesh& state_mesh, const layout& value, const layout& sharded) {
    using D = typename W::tensor_type;
    using G = typename W::gradient_type;
    using plan_t = redistribution_plan<typename D::value_type, D::rank>;
    const auto extent =
        block_of(sharded, state_mesh.shape(), w.value.shape(), state_mesh.rank()).extent;
    auto make = [&] {
        return G(detail::unchecked, state_mesh, w.value.shape(), G::local_type::from_shape(extent),
                 sharded);
    };
    w.shard.emplace(weight_shard<D>{make(), make(), {}});
    w.shard->grad.local().fill(typename D::value_type(0));
    auto slice = std::make_shared<plan_t>(state_mesh, w.value.shape(), value, sharded);
    auto back = std::make_shared<plan_t>(state_mesh, w.value.shape(), sharded, value);
    slice->execute(w.value.local().data(), w.shard->value.local().data());
    for (const auto& slot : w.state) {
        w.shard->state.push_back(make());
        slice->execute(slot.local().data(), w.shard->state.back().local().data());
    }
    w.state.clear();
    return std::pair{std::move(slice), std::move(back)};
}

/// Sets `e`'s planned collectives of weight `p`: the mean, the refresh of the master block,
/// the gradient into the shard (sliced when complete, reduce-scattered by `scatter` when it
/// holds its terms, then summed over the copies), the all-gather back.
template <class W, class T = typename W::tensor_type::value_type,
          std::size_t N = W::tensor_type::rank>
void set_planned_collectives(hsdp_entry& e, W* p, const std::string& name,
                             const hsdp_entry_layouts& l, double copies, bool level2, bool mean,
                             hsdp_plan<T, N> slice, hsdp_plan<T, N> back, hsdp_plan<T, N> scatter) {
    e.scale = [p, copies, mean] {
        if (mean)
            for (auto& x : p->shard->grad.local())
                x = T(double(x) / copies);
    };
    e.refresh = [p, slice] {
        slice->execute(p->value.local().data(), p->shard->value.local().data());
    };
    e.terms = [p, terms = l.terms, level2] {
        return level2 && p->grad.layout() == terms;
    };
    e.to_shard = [p, slice, scatter, terms = l.terms, v = l.value, level2, name, scale = e.scale,
                  across_reduce = e.across_reduce] {
        auto& sh = *p->shard;
        const layout g = p->grad.layout();
        if (g == v) {
            slice->execute(p->grad.local().data(), sh.grad.local().data());
        } else if (scatter && g == terms) {
            scatter->execute(p->grad.local().data(), sh.grad.local().data());
            if (across_reduce)
                across_reduce();
            scale();
        } else {
            throw error("xshard: hsdp: the gradient of weight '" + name + "' is laid out " +
                        g.to_string() + "; " +
                        (level2 ? "expected its terms " + terms.to_string() + " or "
                                : std::string("expected ")) +
                        "the complete gradient " + v.to_string());
        }
        slice->execute(p->value.local().data(), sh.value.local().data());
    };
    e.gather = [p, back] {
        back->execute(p->shard->value.local().data(), p->value.local().data());
    };
}

/// Sets `e`'s part in the fused exchanges of weight `p` (train/hsdp_exchange.hpp): how it
/// joins a batch plan, and the blocks it moves between.
template <class W, class T = typename W::tensor_type::value_type>
void set_exchange_part(hsdp_entry& e, W* p, const hsdp_entry_layouts& l) {
    e.add_to = [p, v = l.value, s = l.sharded, copy_terms = l.copy_terms](void* plan, bool gather) {
        auto& b = *static_cast<batch_redistribution_plan<T>*>(plan);
        if (gather)
            b.add(p->value.shape(), s, v);
        else
            b.add(p->value.shape(), copy_terms, s);
    };
    e.source = [p](bool gather) -> const void* {
        return gather ? p->shard->value.local().data() : p->grad.local().data();
    };
    e.destination = [p](bool gather) -> void* {
        return gather ? p->value.local().data() : p->shard->grad.local().data();
    };
}

/// Sets `e`'s storage operations of weight `p` (level3): the value's and the gradient's
/// local blocks of `extent` given and taken, the gradient labelled as its `terms`.
template <class W, std::size_t N = W::tensor_type::rank>
void set_storage(hsdp_entry& e, W* p, const std::array<std::size_t, N>& extent,
                 const layout& terms) {
    using T = typename W::tensor_type::value_type;
    using L = typename W::tensor_type::local_type;
    using GL = typename W::gradient_type::local_type;
    e.allocate_value = [p, extent] {
        p->value.local() = L::from_shape(extent);
    };
    e.release_value = [p] {
        p->value.local() = L::from_shape(std::array<std::size_t, N>{});
    };
    e.allocate_grad = [p, extent, terms] {
        p->grad.local() = GL::from_shape(extent);
        p->grad.local().fill(T(0));
        p->relabel(terms);
    };
    e.release_grad = [p, terms] {
        p->grad.local() = GL::from_shape(std::array<std::size_t, N>{});
        p->relabel(terms);
    };
    e.restore_grad = [p, extent, terms] {
        if (p->grad.local().size() == 0) {
            p->grad.local() = GL::from_shape(extent);
            p->grad.local().fill(T(0));
        }
        p->relabel(terms);
    };
}

/// Gives weight `w` (named `name`, of `bytes` global bytes) its shard laid out `sharded` at
/// `place` (give_shard) and returns its entry. Local; throws what the plans throw.
template <class W, class Mesh>
hsdp_entry make_hsdp_entry(const std::string& name, W& w, const layout& sharded,
                           const hsdp_entry_place<Mesh>& place, std::size_t bytes) {
    using T = typename W::tensor_type::value_type;
    constexpr std::size_t N = W::tensor_type::rank;
    using plan_t = redistribution_plan<T, N>;
    const auto& mesh = w.value.mesh();
    const auto& ms = mesh.shape();
    const auto& sms = place.state_mesh->shape();
    hsdp_entry_layouts l{w.value.layout(), sharded, {}, {}};
    const auto value_extent = block_of(l.value, ms, w.value.shape(), mesh.rank()).extent;
    auto [slice, back] = give_shard(w, *place.state_mesh, l.value, l.sharded);
    l.terms = w.term_layout();
    // The terms as the copy mesh sees them (the same pending sums: no axis there is of one
    // rank that is not one in the mesh); the reduce-scatter on it sums a copy's terms,
    // `across_reduce` then the copies.
    l.copy_terms = without_unit_sums(dual(l.value, sms), sms);
    hsdp_plan<T, N> scatter;
    if (place.level2 && !(l.terms == l.value))
        scatter =
            std::make_shared<plan_t>(*place.state_mesh, w.value.shape(), l.copy_terms, l.sharded);
    W* p = &w;
    hsdp_entry e;
    e.space = place.space;
    if (const communicator* across = place.across)
        e.across_reduce = [p, across] {
            auto& g = p->shard->grad.local();
            mpi::allreduce(*across, std::span<T>(g.data(), g.size()), reduction::sum);
        };
    const double copies = double(ms.group_size(l.value.replicated_axes(ms)));
    set_planned_collectives(e, p, name, l, copies, place.level2, place.mean, std::move(slice),
                            std::move(back), std::move(scatter));
    set_exchange_part(e, p, l);
    e.type = typeid(T);
    e.plan_exchange = &plan_hsdp_exchange_of<T>;
    e.bytes = bytes;
    set_storage(e, p, value_extent, l.terms);
    return e;
}

} // namespace xshard::detail
