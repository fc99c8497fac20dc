module hookline.local/pause

go 1.22
