#pragma once
/// \file
/// Gradient synchronisation: every gradient summed (or averaged) over the ranks that hold
/// redundant copies of its parameter — the parameter's replicated mesh axes, which data
/// parallelism makes the data-parallel axes.
///
/// Gradients travel in fusion buckets (gradients of one redundancy group and element type,
/// packed up to the all-reduce threshold of `comm_fusion`, 4 MiB by default, its automatic
/// mode): one all-reduce per bucket, xshard's pairwise all-reduce from 1 MiB on
/// (benchmarks/README.md compares it with MPI's). A
/// `gradient_synchronizer` plans the buckets and allocates their buffers once and is reused
/// every step; `synchronize_gradients` is the one-off form (which keeps messages: see "Node
/// storage" below).
///
/// Overlap: call `ready(name)` as the backward pass produces each gradient; a bucket's
/// all-reduce starts (nonblocking) as soon as its last gradient is ready, while the caller
/// goes on, and `wait()` completes them all. (Open MPI progresses nonblocking collectives
/// inside MPI calls; `ready` pokes them forward each time it is called.)
///
/// 16-bit gradients (`float16`, `bfloat16`) are summed in their own type, rounding every
/// addition, unless `fp32_communication` (MindSpore's enable_fp32_communication / gradient
/// fp32 sync) converts each bucket to float32 for the all-reduce and back afterwards.
///
/// Shared memory: a kept synchronizer all-reduces the buckets of every group whose members
/// share one node through shared memory (comm/node_reduce.hpp), not by messages. A fused
/// bucket is never packed: each member copies the parts of its gradients that the others
/// reduce into its staging window ((p - 1) / p of the bucket), adds the others' terms of its
/// own part into its gradients, and copies the others' results from their windows, the mean's
/// division done on the way (one pass over each byte fewer than packing, all-reducing and
/// unpacking a buffer; benchmarks/README.md, "Shared-memory gradient all-reduce"). A bucket
/// of one parameter is reduced on the gradient itself, read in place when the gradient lies
/// in node storage (a parameter on a `node_shared` mesh, core/node_shared.hpp:
/// node_arena.hpp), staged otherwise. These all-reduces are blocking: `ready` then only
/// counts, and `wait` runs the buckets in order. Only a kept synchronizer does this
/// (`gradient_options::shared_memory`): the one-off `synchronize_gradients` would make its
/// windows every call, which costs more than messages do (benchmarks/README.md).

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/train/fusion.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <vector>

namespace xshard {

/// MindSpore's comm_fusion: the fusion of each kind of collective. Gradient synchronisation
/// uses `allreduce` (modes auto, size and index); optimizer sharding (train/hsdp.hpp) fuses its
/// all-gathers and reduce-scatters by `allgather` and `reducescatter` (auto and size).
struct comm_fusion {
    fusion_threshold allreduce{};
    fusion_threshold allgather{};
    fusion_threshold reducescatter{};
};

struct gradient_options {
    /// Divide the sums by the number of copies (enable_gradients_mean).
    bool mean = false;
    /// All-reduce 16-bit gradients in float32 (enable_fp32_communication).
    bool fp32_communication = false;
    comm_fusion fusion{};
    /// Layouts of the parameters, when they are not the parameters' own.
    std::optional<layout_dict> layouts = std::nullopt;
    /// Whether a kept synchronizer all-reduces the buckets of groups that share a node
    /// through shared memory (see the file comment). `synchronize_gradients` turns it off:
    /// the windows a synchronizer makes for it once (collective allocations, page faults)
    /// cost more than one step's saving.
    bool shared_memory = true;
};

namespace detail {

/// What a bucket's all-reduce does to its sums (the `finish` of comm/node_reduce.hpp): divide
/// them by the number of copies for a mean, nothing when `copies` is 1.
struct divide_by {
    double copies = 1;
    template <class W>
    void operator()(W* p, std::size_t m) const noexcept {
        if (copies == 1)
            return;
        if constexpr (std::is_floating_point_v<W>) {
            scale(p, m, W(1.0 / copies));
        } else {
            for (std::size_t j = 0; j < m; ++j)
                p[j] = W(double(p[j]) / copies);
        }
    }
};

/// node_allocator whose vectors leave their bytes uninitialised: a bucket's staging buffer
/// is written whole by packing before it is read, so zeroing it would only cost a pass over
/// memory (and its page faults) every time a synchronizer is built.
template <class T>
struct packing_allocator : node_allocator<T> {
    using value_type = T;
    template <class U>
    struct rebind {
        using other = packing_allocator<U>;
    };
    packing_allocator() noexcept = default;
    template <class U>
    packing_allocator(const packing_allocator<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
        ::new (static_cast<void*>(p)) U;
    }
};

} // namespace detail

/// Plans the synchronisation of a container of gradients once and runs it every step (see
/// the file comment). `params` gives the layouts (its redundancy groups); `grads` must have
/// the same parameters, shapes and element types, and must outlive the synchronizer (a
/// gradient's storage may be replaced between steps; its shape may not).
class gradient_synchronizer {
public:
    template <parameter_container P, parameter_container G>
    gradient_synchronizer(const P& params, G& grads, const gradient_options& options = {})
        : options_(options) {
        // Non-trainable parameters (batch norm's running statistics) have no gradient.
        const layout_dict layouts =
            options.layouts ? *options.layouts : layouts_of(params, /*trainable_only=*/true);
        refs_ = detail::param_refs(grads, &layouts);
        if (refs_.empty())
            return;
        // Each gradient's typed steps, instantiated for the element types `grads` holds.
        std::vector<const typed_steps*> steps;
        for_each_parameter(grads, [&](const std::string&, auto& t) {
            steps.push_back(steps_for<typename std::remove_cvref_t<decltype(t)>::value_type>(
                options.fp32_communication));
        });
        std::vector<std::string> grad_names;
        for (const auto& r : refs_)
            grad_names.push_back(r.name);
        const bool same_names = parameter_names(params, /*trainable_only=*/true) == grad_names;
        // A gradient's storage can move between steps (an xtensor `+=` that is not `noalias`
        // swaps in a new buffer, `set_gradient` replaces it): its address is read again before
        // each bucket is packed and unpacked, never kept from the constructor. Once summed,
        // with `relabel`, the gradients get what their parameters' layouts say (unsummed, a
        // weight's gradient holds this rank's term, laid out as the dual: see
        // param/weight.hpp). One walk does both, so that it is compiled once.
        refresh_ = [&grads, layouts, this](bool relabel) {
            std::size_t i = 0;
            for_each_parameter(grads, [&](const std::string& name, auto& t) {
                using D = std::remove_cvref_t<decltype(t)>;
                constexpr bool writable = !std::is_const_v<std::remove_reference_t<decltype(t)>>;
                if constexpr (D::static_layout.dynamic && writable) {
                    const auto it = layouts.find(name);
                    if (relabel && it != layouts.end() && !(t.layout() == it->second))
                        t = D(detail::unchecked, t.mesh(), t.shape(), std::move(t).local(),
                              it->second);
                }
                auto& r = refs_[i++];
                auto& local = t.local();
                if constexpr (writable)
                    r.data = reinterpret_cast<std::byte*>(local.data());
                r.cdata = reinterpret_cast<const std::byte*>(local.data());
            });
        };
        plan(std::move(steps), same_names);
    }

    /// Synchronises every gradient now (blocking).
    void synchronize();

    /// Marks the gradient `name` as computed; starts its bucket's all-reduce when it was the
    /// bucket's last. Names not in the container are an error.
    void ready(std::string_view name);

    /// Completes every started all-reduce (starting those whose gradients were never marked
    /// ready) and writes the results back into the gradients.
    void wait();

    /// The number of buckets (one all-reduce each).
    std::size_t buckets() const noexcept { return buckets_.size(); }

    /// Whether some bucket is all-reduced through shared memory (its group shares a node).
    bool uses_shared_memory() const noexcept {
        return std::any_of(shared_.begin(), shared_.end(), [](char c) { return c != 0; });
    }

    /// The bytes of this rank's staging windows of the shared-memory all-reduces: 0 while
    /// every bucket of every member was read in place from node storage.
    std::size_t node_staging_bytes() const;

private:
    /// The steps of a bucket of gradients of type T all-reduced in type Wire (T, or float for
    /// T 16-bit with fp32_communication). Held by pointer, so that only the element types of
    /// the container given to the constructor are instantiated.
    struct typed_steps {
        void (gradient_synchronizer::*reduce)(std::size_t, bool);
        void (gradient_synchronizer::*unpack)(std::size_t);
        bool (gradient_synchronizer::*shares_node)(const communicator&);
    };

    template <class Wire, class T>
    static const typed_steps* steps_of() {
        static constexpr typed_steps steps{&gradient_synchronizer::reduce<Wire, T>,
                                           &gradient_synchronizer::unpack<Wire, T>,
                                           &gradient_synchronizer::shares_node<Wire>};
        return &steps;
    }

    /// The element types a gradient may have, and their names for the message that refuses
    /// any other.
    template <class T>
    static constexpr bool gradient_element =
        sixteen_bit_float<T> || std::is_same_v<T, float> || std::is_same_v<T, double> ||
        std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;
    static constexpr const char* gradient_elements =
        "xshard: gradients must be float, double, float16, bfloat16, int32 or int64";

    /// The steps of gradients of type T; null for a type gradients cannot have.
    template <class T>
    static const typed_steps* steps_for(bool fp32_communication) {
        if constexpr (!gradient_element<T>)
            return nullptr;
        else if constexpr (sixteen_bit_float<T>)
            return fp32_communication ? steps_of<float, T>() : steps_of<T, T>();
        else
            return steps_of<T, T>();
    }

    template <class Wire>
    bool shares_node(const communicator& group) {
        return reducer_for<Wire>().shares_node(group);
    }

    /// The constructor's part that does not depend on the containers' types: checks (agreed
    /// on every rank), the buckets, their paths and their buffers.
    void plan(std::vector<const typed_steps*> steps, bool same_names);

    /// The finish of bucket k's all-reduce (the mean's division).
    detail::divide_by finish_of(std::size_t k) const {
        return {options_.mean ? double(refs_[buckets_[k].members.front()].group->size()) : 1.0};
    }

    /// Packs bucket k and all-reduces it: blocking (pairwise for large buckets, through
    /// shared memory when its group shares a node) or started nonblocking.
    void run(std::size_t k, bool nonblocking);

    /// All-reduces bucket k in type Wire: on the gradients themselves for a bucket of one
    /// parameter in its own type or through shared memory, through the bucket's buffer
    /// otherwise; the mean's division on the way unless started nonblocking.
    template <class Wire, class T>
    void reduce(std::size_t k, bool nonblocking) {
        const auto& b = buckets_[k];
        const auto& group = *refs_[b.members.front()].group;
        if constexpr (std::is_same_v<Wire, T>) {
            if (shared_[k] && b.members.size() > 1) {
                // The members' spans, in a list kept from run to run (no allocation per step).
                thread_local std::vector<std::span<T>> pieces;
                pieces.clear();
                for (std::size_t i : b.members)
                    pieces.emplace_back(reinterpret_cast<T*>(refs_[i].data), refs_[i].count);
                reducer_for<Wire>().all_reduce_pieces(group, std::span<const std::span<T>>(pieces),
                                                      reduction::sum, finish_of(k));
                finished_[k] = 1;
                return;
            }
        }
        Wire* wire = wire_of<Wire, T>(k);
        if (static_cast<void*>(wire) != static_cast<void*>(refs_[b.members.front()].data)) {
            std::size_t n = 0;
            for (std::size_t i : b.members) {
                const auto* g = reinterpret_cast<const T*>(refs_[i].data);
                if constexpr (std::is_same_v<Wire, T>)
                    std::memcpy(wire + n, g, refs_[i].bytes());
                else
                    std::copy(g, g + refs_[i].count, wire + n); // widens
                n += refs_[i].count;
            }
        }
        const std::size_t n = b.bytes / sizeof(T);
        if (nonblocking && !shared_[k]) {
            requests_[k] = iallreduce(group, std::span(wire, n), reduction::sum);
            finished_[k] = 0;
        } else {
            reducer_for<Wire>().all_reduce(group, wire, wire, n, reduction::sum, finish_of(k));
            finished_[k] = 1;
        }
    }

    /// Where bucket k is reduced: the gradient itself for a bucket of one parameter in its own
    /// type, the bucket's buffer otherwise.
    template <class Wire, class T>
    Wire* wire_of(std::size_t k) {
        const auto& b = buckets_[k];
        if (b.members.size() == 1 && std::is_same_v<Wire, T>)
            return reinterpret_cast<Wire*>(refs_[b.members.front()].data);
        return reinterpret_cast<Wire*>(buffers_[k].data());
    }

    template <class Wire>
    reducer<Wire>& reducer_for() {
        // The pairwise path serves every size for the 16-bit types, which MPI cannot add.
        reduce_tuning tuning;
        if constexpr (sixteen_bit_float<Wire>)
            tuning.min_piece_bytes = 0;
        if (options_.shared_memory) {
            tuning.shared_memory_all_reduce = true;
            tuning.shared_memory_min_bytes = 0;
        }
        auto& slot = reducers_[typeid(Wire)];
        if (!slot.reducer) {
            slot.reducer = std::shared_ptr<void>(
                new reducer<Wire>(tuning), [](void* r) { delete static_cast<reducer<Wire>*>(r); });
            slot.staging = [](const void* r) {
                return static_cast<const reducer<Wire>*>(r)->node_staging_bytes();
            };
        }
        return *static_cast<reducer<Wire>*>(slot.reducer.get());
    }

    /// Waits for the started all-reduces and unpacks every bucket (dividing for the mean
    /// what was all-reduced nonblocking).
    void finish();

    template <class Wire, class T>
    void unpack(std::size_t k) {
        const auto& b = buckets_[k];
        if (std::is_same_v<Wire, T> && shared_[k] && b.members.size() > 1)
            return; // reduced on the gradients through shared memory, finished
        Wire* wire = wire_of<Wire, T>(k);
        if (!finished_[k])
            finish_of(k)(wire, b.bytes / sizeof(T));
        if (static_cast<void*>(wire) == static_cast<void*>(refs_[b.members.front()].data))
            return; // reduced in place
        for (std::size_t i : b.members) {
            auto* g = reinterpret_cast<T*>(refs_[i].data);
            if constexpr (std::is_same_v<Wire, T>)
                std::memcpy(g, wire, refs_[i].bytes());
            else
                std::copy(wire, wire + refs_[i].count, g); // narrows
            wire += refs_[i].count;
        }
    }

    gradient_options options_;
    std::vector<detail::param_ref> refs_;
    // The gradients' current addresses into refs_; with true, first their layouts once summed.
    std::function<void(bool)> refresh_;
    std::vector<detail::bucket> buckets_;
    std::vector<const typed_steps*> steps_; // bucket k's typed steps
    std::vector<int> bucket_of_;
    // From node storage when it is open (else the heap): filled by packing.
    std::vector<std::vector<std::byte, detail::packing_allocator<std::byte>>> buffers_;
    std::vector<std::size_t> waiting_;
    std::vector<char> started_;  // bucket k's all-reduce has run or started since the last wait
    std::vector<char> shared_;   // bucket k's group shares a node: all-reduced through it
    std::vector<char> finished_; // bucket k's sums are divided for the mean (or need not be)
    std::vector<request> requests_;
    struct typed_reducer {
        std::shared_ptr<void> reducer; // a reducer<Wire>
        std::size_t (*staging)(const void*) = nullptr;
    };
    std::map<std::type_index, typed_reducer> reducers_;
};

/// Sums (or averages) every gradient of `grads` over its parameter's redundant copies (see
/// the file comment). Collective over the parameters' mesh.
template <parameter_container P, parameter_container G>
void synchronize_gradients(const P& params, G& grads, const gradient_options& options = {}) {
    gradient_options once = options;
    once.shared_memory = false;
    gradient_synchronizer(params, grads, once).synchronize();
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/gradients.ipp>
#else
namespace xshard {
#define XSHARD_DETAIL_GRADIENT_STEPS(T)                                                            \
    XSHARD_INSTANTIATE void gradient_synchronizer::reduce<T, T>(std::size_t, bool);               \
    XSHARD_INSTANTIATE void gradient_synchronizer::unpack<T, T>(std::size_t);
XSHARD_COMPILED_ELEMENTS(XSHARD_DETAIL_GRADIENT_STEPS)
#undef XSHARD_DETAIL_GRADIENT_STEPS
} // namespace xshard
#endif
