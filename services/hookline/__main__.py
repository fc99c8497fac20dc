from hookline.cli import main

main()
