#pragma once
/// \file
/// Datasets and their samples: what the data pipeline (views.hpp, loader.hpp) reads.
///
/// A dataset is a sized random-access range of samples: a `std::vector` of them, a
/// range-v3 view that makes them on demand, a reader's result. Two kinds of sample are
/// understood, each with the batch that `collate` makes of several of them:
///
///     example<T>                         ->  example_batch<T>: x (n, features), y (n)
///     xt::xtensor<V, 1> (token_window)   ->  xt::xtensor<V, 2> (n, length)

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/range/traits.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <string>
#include <type_traits>

namespace xshard::data {

/// A labelled sample of a classification task: a feature vector and a class index.
template <ordered T>
struct example {
    xt::xtensor<T, 1> features;
    std::int64_t label = 0;
};

/// A sample of a language-modelling task: seq_len + 1 consecutive tokens (inputs are the
/// first seq_len, targets the last seq_len).
using token_window = xt::xtensor<std::int64_t, 1>;

/// A sized random-access range of samples.
template <class D>
concept dataset = std::ranges::random_access_range<D> && std::ranges::sized_range<D>;

/// A dataset the views of views.hpp can adapt: also a range-v3 viewable range (an lvalue
/// container, or a view).
template <class D>
concept viewable_dataset = dataset<D> && ranges::viewable_range<D> &&
    ranges::random_access_range<D> && ranges::sized_range<D>;

/// The type of a dataset's samples.
template <dataset D>
using sample_t = std::ranges::range_value_t<D>;

/// Index of a sample in the data views. 32 bits: range-v3 gives a 64-bit `iota` a
/// difference type that std::ranges does not accept, so datasets hold < 2^32 samples.
using index_type = std::uint32_t;

namespace detail {

/// Checks that every rank of `c` holds a dataset of `samples` samples of `width` features
/// (0 when unknown): otherwise every rank throws, naming the sizes seen, since ranks that
/// count different steps per epoch would call different collectives. Collective: one
/// all-reduce of four integers.
XSHARD_DECL void check_dataset_agrees(const communicator& c, std::size_t samples, std::size_t width,
                                      const char* who);

template <class S>
struct is_example : std::false_type {};
template <class T>
struct is_example<example<T>> : std::true_type {};

template <class S>
struct is_vector_tensor : std::false_type {};
template <class V>
struct is_vector_tensor<xt::xtensor<V, 1>> : std::bool_constant<ordered<V>> {};

/// `n` as an index_type; throws when a dataset is too large for one.
XSHARD_DECL index_type checked_index(std::size_t n, const char* what);

} // namespace detail

/// A sample `collate` can batch: an `example<T>` or a rank-1 `xt::xtensor`.
template <class S>
concept sample = detail::is_example<S>::value || detail::is_vector_tensor<S>::value;

/// A batch of classification samples: row i of `x` is sample i's features, `y[i]` its label.
template <ordered T>
struct example_batch {
    xt::xtensor<T, 2> x;
    xt::xtensor<std::int64_t, 1> y;
};

namespace detail {
template <class S>
struct batch_of;
template <class T>
struct batch_of<example<T>> {
    using type = example_batch<T>;
};
template <class V>
struct batch_of<xt::xtensor<V, 1>> {
    using type = xt::xtensor<V, 2>;
};
} // namespace detail

/// The batch type of sample type S.
template <sample S>
using batch_t = typename detail::batch_of<S>::type;

/// A sized input range (std or range-v3) of samples.
template <class R>
concept sample_range =
    ranges::input_range<R> && ranges::sized_range<R> && sample<ranges::range_value_t<R>>;

/// Stacks samples into their batch: row i is the i-th sample. Every sample must have the
/// same length (else xshard::error naming the sample). An empty range gives a batch with 0
/// rows and `width` columns.
struct collate_fn {
    template <sample_range R>
    auto operator()(R&& samples, std::size_t width = 0) const {
        using S = ranges::range_value_t<R>;
        const auto n = std::size_t(ranges::size(samples));
        batch_t<S> out;
        std::size_t i = 0;
        for (auto&& s : samples) {
            const auto& row = values(s);
            if (i == 0) {
                width = row.size();
                allocate(out, n, width);
            } else if (row.size() != width) {
                throw error("xshard: collate: sample " + std::to_string(i) + " of the batch has " +
                            std::to_string(row.size()) + " values but sample 0 has " +
                            std::to_string(width));
            }
            std::copy(row.begin(), row.end(), rows(out).data() + i * width);
            if constexpr (detail::is_example<S>::value)
                out.y(i) = s.label;
            ++i;
        }
        if (i == 0)
            allocate(out, 0, width);
        return out;
    }

private:
    template <class T>
    static const xt::xtensor<T, 1>& values(const example<T>& s) {
        return s.features;
    }
    template <class V>
    static const xt::xtensor<V, 1>& values(const xt::xtensor<V, 1>& s) {
        return s;
    }

    template <class T>
    static xt::xtensor<T, 2>& rows(example_batch<T>& b) {
        return b.x;
    }
    template <class V>
    static xt::xtensor<V, 2>& rows(xt::xtensor<V, 2>& b) {
        return b;
    }

    template <class T>
    static void allocate(example_batch<T>& b, std::size_t n, std::size_t width) {
        b.x = xt::xtensor<T, 2>::from_shape({n, width});
        b.y = xt::xtensor<std::int64_t, 1>::from_shape({n});
    }
    template <class V>
    static void allocate(xt::xtensor<V, 2>& b, std::size_t n, std::size_t width) {
        b = xt::xtensor<V, 2>::from_shape({n, width});
    }
};

/// Stacks samples into a batch (see collate_fn).
inline constexpr collate_fn collate{};

} // namespace xshard::data

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/data/dataset.ipp>
#endif
