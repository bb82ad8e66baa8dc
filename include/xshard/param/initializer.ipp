#pragma once
/// \file
/// The definitions of what param/initializer.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/param/initializer.hpp>

namespace xshard {

XSHARD_DECL initializer default_initializer(const std::string& name,
                                            std::span<const std::size_t> shape) {
    if (shape.size() >= 2)
        return initializer::he_uniform();
    const std::string_view n = name;
    if (n == "gamma" || n.ends_with(".gamma"))
        return initializer::constant(1);
    return initializer::zeros();
}

} // namespace xshard

