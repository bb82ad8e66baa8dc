#pragma once
/// \file
/// The modules of a pipelined model, type-erased, each run in *activation slots*: a forward
/// pass keeps what its backward pass needs inside the layer object, so a stage with several
/// micro-batches in flight runs each in its own copy of its layers (a slot), made once
/// without the weights (moved out for the copy); the home layer's weights are lent to the
/// slot for each pass by swapping (a few pointer moves), so gradients add up in the home
/// weights and the slots never hold weights of their own.

#include <xshard/param/traversal.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::pipeline {

/// A layer a pipeline can run: forward and backward on tensors of type X.
template <class L, class X>
concept layer_of = std::copy_constructible<L> && requires(L& l, const X& x) {
    { l.forward(x) } -> std::convertible_to<X>;
    { l.backward(x) } -> std::convertible_to<X>;
};

/// A layer whose backward pass splits into input and weight gradients (see
/// nn::column_parallel_linear::backward_input); others run whole in the B pass.
template <class L, class X>
concept split_layer_of = layer_of<L, X> && requires(L& l, const X& x) {
    { l.backward_input(x) } -> std::convertible_to<X>;
    l.backward_weight();
};

namespace detail {

/// One module of the chain, type-erased: its passes on a slot (see the file comment).
template <class X>
struct chain_module {
    std::string name;
    double cost = 0; // elements of its parameters
    virtual ~chain_module() = default;
    virtual X forward(std::size_t slot, const X& x) = 0;
    virtual X backward(std::size_t slot, const X& dy) = 0;
    virtual X backward_input(std::size_t slot, const X& dy) = 0;
    virtual void backward_weight(std::size_t slot) = 0;
};

template <class L, class X>
class chain_layer final : public chain_module<X> {
public:
    explicit chain_layer(L& home)
        : home_(&home) {}

    X forward(std::size_t slot, const X& x) override {
        return run(slot, [&](L& l) { return X(l.forward(x)); });
    }
    X backward(std::size_t slot, const X& dy) override {
        return run(slot, [&](L& l) { return X(l.backward(dy)); });
    }
    X backward_input(std::size_t slot, const X& dy) override {
        if constexpr (split_layer_of<L, X>)
            return run(slot, [&](L& l) { return X(l.backward_input(dy)); });
        else
            return backward(slot, dy);
    }
    void backward_weight(std::size_t slot) override {
        if constexpr (split_layer_of<L, X>)
            run(slot, [&](L& l) {
                l.backward_weight();
                return 0;
            });
    }

private:
    /// Runs `f` on slot `s` with the home's weights moved in, and moved back afterwards
    /// (also when `f` throws).
    template <class F>
    auto run(std::size_t s, F&& f) {
        while (slots_.size() <= s)
            add_slot();
        auto& swaps = swaps_[s];
        for (auto& w : swaps)
            w();
        struct back {
            std::vector<std::function<void()>>& swaps;
            ~back() {
                for (auto& w : swaps)
                    w();
            }
        } guard{swaps};
        return f(*slots_[s]);
    }

    /// A copy of the home layer without its weights (moved out for the copy, then back),
    /// and the swaps that lend it the home's weights.
    void add_slot() {
        std::vector<std::function<void()>> restore;
        for_each_weight(*home_, [&](const std::string&, auto& w) {
            using W = std::remove_cvref_t<decltype(w)>;
            auto held = std::make_shared<W>(std::move(w));
            restore.push_back([&w, held] { w = std::move(*held); });
        });
        std::unique_ptr<L> copy;
        try {
            copy = std::make_unique<L>(*home_);
        } catch (...) {
            for (auto& r : restore)
                r();
            throw;
        }
        for (auto& r : restore)
            r();
        std::vector<void*> homes;
        for_each_weight(*home_, [&](const std::string&, auto& w) { homes.push_back(&w); });
        std::vector<std::function<void()>> swaps;
        std::size_t i = 0;
        for_each_weight(*copy, [&](const std::string&, auto& w) {
            using W = std::remove_cvref_t<decltype(w)>;
            auto* h = static_cast<W*>(homes[i++]);
            swaps.push_back([h, &w] { std::swap(*h, w); });
        });
        slots_.push_back(std::move(copy));
        swaps_.push_back(std::move(swaps));
    }

    L* home_;
    std::vector<std::unique_ptr<L>> slots_;
    std::vector<std::vector<std::function<void()>>> swaps_;
};

} // namespace detail

} // namespace xshard::pipeline
