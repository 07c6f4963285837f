from models.cpu_gemm import main

main()
