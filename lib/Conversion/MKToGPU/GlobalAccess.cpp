// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Global-memory accesses the NVVM dialect has no op for, as inline PTX.
//
#include "GlobalAccess.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

#include <cassert>
#include <string>

using namespace mlir;

namespace mok::conversion {

void storeGlobalStreaming(OpBuilder &b, Location loc, Value address,
                          ValueRange words) {
  assert((words.size() == 1 || words.size() == 2 || words.size() == 4) &&
         "st.global takes 1, 2 or 4 words");
  std::string vec =
      words.size() == 1 ? "" : ".v" + std::to_string(words.size());
  std::string list, constraints = "l";
  for (size_t i = 0; i < words.size(); ++i) {
    list += (i ? ", $" : "$") + std::to_string(i + 1);
    constraints += ",r";
  }
  if (words.size() > 1)
    list = "{" + list + "}";
  SmallVector<Value> operands = {address};
  operands.append(words.begin(), words.end());
  LLVM::InlineAsmOp::create(b, loc, TypeRange{}, operands,
                            "st.global.cs" + vec + ".b32 [$0], " + list + ";",
                            constraints,
                            /*has_side_effects=*/true, /*is_align_stack=*/false,
                            LLVM::tailcallkind::TailCallKind::None,
                            LLVM::AsmDialectAttr(), ArrayAttr());
}

void storeGlobalStreaming16(OpBuilder &b, Location loc, Value address,
                            Value value) {
  auto words4 = VectorType::get({4}, b.getI32Type());
  if (value.getType() != words4)
    value = LLVM::BitcastOp::create(b, loc, words4, value);
  SmallVector<Value> words;
  for (int64_t w = 0; w < 4; ++w)
    words.push_back(LLVM::ExtractElementOp::create(
        b, loc, value, arith::ConstantIntOp::create(b, loc, w, 32)));
  storeGlobalStreaming(b, loc, address, words);
}

void reduceAddGlobalF32(OpBuilder &b, Location loc, Value address,
                        ValueRange values) {
  assert((values.size() == 1 || values.size() == 2) &&
         "red.global.add takes 1 or 2 f32");
  std::string asmString = values.size() == 1
                              ? "red.global.add.f32 [$0], $1;"
                              : "red.global.add.v2.f32 [$0], {$1, $2};";
  SmallVector<Value> operands = {address};
  operands.append(values.begin(), values.end());
  LLVM::InlineAsmOp::create(b, loc, TypeRange{}, operands, asmString,
                            values.size() == 1 ? "l,f" : "l,f,f",
                            /*has_side_effects=*/true, /*is_align_stack=*/false,
                            LLVM::tailcallkind::TailCallKind::None,
                            LLVM::AsmDialectAttr(), ArrayAttr());
}

} // namespace mok::conversion
