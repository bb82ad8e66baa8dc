#pragma once
/// \file
/// What the optimizer and the gradient all-reduce see of a model under optimizer sharding
/// (train/hsdp.hpp): the gradients the optimizer reads, the bytes of its state, and the
/// weights left unsharded, each as a view over the model's weights.

#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>

#include <cstddef>
#include <set>
#include <string>
#include <type_traits>

namespace xshard {

/// The per-rank bytes of the optimizer's state of `model`'s weights and of the master copies
/// it updates: for a sharded weight its shard's master block and slots, for another its value
/// and slots. No communication.
template <parameter_container M>
std::size_t optimizer_state_bytes(M& model) {
    std::size_t n = 0;
    for_each_weight(model, [&](const std::string&, auto& w) {
        using T = typename std::remove_cvref_t<decltype(w.value)>::value_type;
        auto add = [&](const auto& u) {
            n += u.value.local().size() * sizeof(T);
            for (const auto& s : u.state)
                n += s.local().size() * sizeof(T);
        };
        if (w.shard)
            add(*w.shard);
        else
            add(w);
    });
    return n;
}

namespace detail {

/// The weights of a container whose names are in `names`: their values (`grads` false) or
/// their gradients, as a parameter container (for the all-reduce of the unsharded ones).
template <class C>
struct selected_weights {
    C* container;
    std::set<std::string> names;
    bool grads = false;
    friend void visit_parameters(selected_weights& s, auto&& visit) {
        for_each_weight(*s.container, [&](const std::string& name, auto& w) {
            if (!s.names.contains(name))
                return;
            if (s.grads)
                visit(name, w.grad);
            else
                visit(name, w.value);
        });
    }
};

} // namespace detail

/// The gradients an optimizer reads under sharding: a sharded weight's sharded gradient, an
/// unsharded weight's own, with the weights' names (a parameter container: for global_norm,
/// clip_by_global_norm, local norms; each element is counted once, the sharded layout saying
/// which rank holds it).
template <class C>
struct optimizer_gradients {
    C& container;
    friend void visit_parameters(optimizer_gradients& g, auto&& visit) {
        for_each_weight(g.container, [&](const std::string& name, auto& w) {
            if (w.shard)
                visit(name, w.shard->grad);
            else
                visit(name, w.grad);
        });
    }
};
template <class C>
optimizer_gradients(C&) -> optimizer_gradients<C>;

} // namespace xshard
