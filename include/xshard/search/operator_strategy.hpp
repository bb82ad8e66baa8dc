#pragma once
/// \file
/// A searched strategy of a described network as the contents of an operator strategy file
/// (io/operator_strategy_file.hpp): what `xshard-plan search --model ... --save` writes.
///
///     xshard::save_operator_strategy(path, xshard::make_operator_strategy(net, *r.best));

#include <xshard/compiled.hpp>
#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <cstddef>
#include <string>

namespace xshard {

/// The file contents for `plan`, chosen for `net` on dp x tp x pp of its degrees ranks.
XSHARD_DECL operator_strategy make_operator_strategy(const network_spec& net,
                                                     const searched_strategy& plan);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/operator_strategy.ipp>
#endif
