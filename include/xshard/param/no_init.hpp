#pragma once
/// \file
/// Construction without values (MindSpore's `with no_init_parameters(): net = Net()`): while
/// an `xshard::no_init_parameters` guard lives on a thread, the layers built there make their
/// drawn weights as this rank's blocks only, holding NaN, instead of drawing them. A drawn
/// weight costs its whole size in draws on every rank (a sequential engine walks every
/// element before the rank's block: tensor/distribute.hpp's `generate`); made without values
/// it costs its block, so a model larger than one rank's memory is built in its blocks, and
/// `auto_parallel::no_init_parameters_in_compile()` then initialises each block in place
/// (param/initializer.hpp). Constant weights (biases, normalisation scales) are set as usual:
/// they cost their block either way. The NaN makes a forgotten initialisation show at once:
/// `auto_parallel::compile()` without it raises on every rank.

namespace xshard {

namespace detail {
/// How many no_init_parameters guards live on this thread.
inline int& no_init_depth() noexcept {
    thread_local int depth = 0;
    return depth;
}
} // namespace detail

/// The guard (see the file comment): layers built while one lives on this thread make their
/// drawn weights without values. Guards nest.
class no_init_parameters {
public:
    no_init_parameters() noexcept { ++detail::no_init_depth(); }
    ~no_init_parameters() { --detail::no_init_depth(); }
    no_init_parameters(const no_init_parameters&) = delete;
    no_init_parameters& operator=(const no_init_parameters&) = delete;

    /// Whether a guard lives on this thread.
    static bool active() noexcept { return detail::no_init_depth() > 0; }
};

} // namespace xshard
