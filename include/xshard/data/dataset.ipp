#pragma once
/// \file
/// The definitions of what data/dataset.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/data/dataset.hpp>

namespace xshard::data {

namespace detail {

XSHARD_DECL void check_dataset_agrees(const communicator& c, std::size_t samples, std::size_t width,
                                      const char* who) {
    const auto r = value_ranges<2>(c, {samples, width});
    if (!r[0].agrees())
        throw error(std::string("xshard: ") + who +
                    ": the ranks hold datasets of different sizes (" + std::to_string(r[0].least) +
                    " to " + std::to_string(r[0].most) +
                    " samples); every rank must read the same dataset");
    if (!r[1].agrees())
        throw error(std::string("xshard: ") + who +
                    ": the ranks hold samples of different widths (" + std::to_string(r[1].least) +
                    " to " + std::to_string(r[1].most) +
                    " values); every rank must read the same dataset");
}

XSHARD_DECL index_type checked_index(std::size_t n, const char* what) {
    if (n > std::numeric_limits<index_type>::max())
        throw error(std::string("xshard: ") + what + ": " + std::to_string(n) +
                    " samples; the data views handle fewer than 2^32");
    return index_type(n);
}

} // namespace detail

} // namespace xshard::data

