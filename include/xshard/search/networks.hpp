#pragma once
/// \file
/// The search's descriptions of two networks (search/network_spec.hpp): an MLP and a
/// GPT-style decoder, for dry runs of the chain search at any rank count (`xshard-plan search
/// --model`). A network that trains is a program (graph/, search/program_search.hpp).
///
///     auto net = xshard::mlp_network({784, 512, 512, 10}, 64);   // linear1, relu1, ...

#include <xshard/compiled.hpp>
#include <xshard/search/network_spec.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard {

/// An MLP of the given widths, e.g. {784, 512, 512, 10}: linear, relu, ..., linear.
XSHARD_DECL network_spec mlp_network(const std::vector<std::size_t>& widths, std::size_t batch);

/// A GPT-style decoder: embedding, `layers` blocks (norm, qkv, attention, projection, norm,
/// up, gelu, down; residual additions are not priced), a final norm and the vocabulary head.
XSHARD_DECL network_spec transformer_network(std::size_t layers, std::size_t hidden,
                                             std::size_t heads, std::size_t seq, std::size_t vocab,
                                             std::size_t batch);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/networks.ipp>
#endif
