// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok-opt: run mok's passes and pipelines on .mlir files.
//
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

#include "mok/InitAllDialects.h"
#include "mok/InitAllPasses.h"

int main(int argc, char **argv) {
  mok::registerAllPasses();
  mlir::DialectRegistry registry;
  mok::registerAllDialects(registry);
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "mok optimizer driver\n", registry));
}
